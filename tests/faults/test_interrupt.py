"""Ctrl-C of a command waiting on tier 2 that stopped answering: the command ends at once with 130 ("tiering:
interrupted"), not after the retries of the requests in flight (minutes with the default timeout; Python's
exit waits for every worker thread), and what it left is taken up by the next run as a killed process's is.
Through the `tiering` command, a TCP proxy that answers no PUT or POST, the run's RGW and PostgreSQL."""
from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.faults.test_slow_link import KIB, link  # noqa: F401 - the fixture
from tests.integration.test_cli import cli  # noqa: F401 - the fixture


def test_ctrl_c_ends_an_offload_whose_uploads_get_no_answer_at_once(cli, link):  # noqa: F811
    over = link(rate=64 * 1024 * KIB, delay=0)
    here = {"TIERING_S3_ENDPOINT_URL": over.url, "TIERING_S3_TIMEOUT_SECONDS": "5"}
    cli("topic", "create", "ci", "--rollover-entries", "3").ok()
    cli("produce", "ci", "--entries", "20", "--entry-size", "100").ok()  # ledgers 0-5 sealed, 6 open
    over.hold_writes()
    # SIGINT as a terminal's Ctrl-C delivers it: the suite may run with it ignored (started as a shell's
    # background job), which children inherit, and a Python started so never raises KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-m", "tiering", "offload-prefix", "ci", "--all-sealed"],
                            env={**cli.env, **here}, cwd=cli.cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not over.held and time.monotonic() < deadline:
        time.sleep(0.05)
    assert over.held, "no upload reached the link: the test tested nothing"
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (130, "tiering: interrupted\n")
    assert time.monotonic() - interrupted < 10, "waited for the held request's tries (5 x 5 s)"

    over.hold_writes(False)  # the link answers again: the next run takes the interrupted attempt over
    res = cli("offload-prefix", "ci", "--all-sealed", "--json", env=here).ok().json
    assert res["offloaded_count"] == 6 and res["failed"] == [], res
    assert cli("verify", "ci").ok().stdout.rstrip().endswith("OK")
