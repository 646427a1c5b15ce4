"""A private PostgreSQL cluster on a free loopback port, for tests that need a server of their own (an empty
one per test, or one configured differently from the shared server: TLS only)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from tests.support.processes import free_port


def as_postgres(*cmd) -> list[str]:
    """initdb and pg_ctl refuse to run as root: under root they run as the postgres user."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


def give_to_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        shutil.chown(path, "postgres")


@contextmanager
def private_postgres(name: str, options: str = "",
                     prepare: Callable[[Path], None] | None = None) -> Iterator[str]:
    """Starts a cluster (trust authentication, fsync off), yields its base URL without a database
    (postgresql://postgres@127.0.0.1:PORT) and stops it with everything under it. `prepare(data_dir)` runs
    after initdb, before the start (certificates, pg_hba.conf); `options` are extra server flags."""
    pgbin = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1]).parent
    top = Path(tempfile.mkdtemp(prefix=f"tiering-pg-{name}-"))  # not under pytest's 0700 tmp: postgres reads it
    top.chmod(0o755)
    data, sock = top / "data", top / "sock"
    sock.mkdir()
    give_to_postgres(top)
    give_to_postgres(sock)
    try:
        subprocess.run(as_postgres(str(pgbin / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust"),
                       check=True, capture_output=True, timeout=120)
        if prepare is not None:
            prepare(data)
        port = free_port()
        opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off {options}".strip()
        subprocess.run(as_postgres(str(pgbin / "pg_ctl"), "-D", str(data), "-l", str(top / "log"), "-o", opts,
                                   "-w", "start"), check=True, capture_output=True, timeout=60,
                       start_new_session=True)
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}"
        finally:
            subprocess.run(as_postgres(str(pgbin / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"),
                           capture_output=True, timeout=60)
    finally:
        shutil.rmtree(top, ignore_errors=True)
