"""One offload against `upload_file` of the same file, alternating in one process, with where the offload's
time goes: a timeline (ms from the call, medians) of the bucket HEAD and the attempt's first transaction
(both on threads of their own, beside the packing), each block packed, the upload's steps (created, each
part stored, completed), the index PUT and the commit.

For the fixed part of a small offload (issue: one large offload >= 0.95 of upload_file at 16 MiB), which
`bench_tier2.py` case 1 reports only as a ratio. With --pin the Ceph daemons get CPU 0 and this process
the others (benchkit.pinned), as with a remote S3.

    set -a; . .local/env; set +a
    .venv/bin/python bench/bench_offload_timeline.py --size-mib 16 --runs 11 --pin     # about a minute

Results go to bench/results/offload_timeline.{json,md} (`make bench` runs it with its defaults).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_tier2 import UPLOAD_EXTRA, transfer_config  # noqa: E402
from benchkit import MIB, ROOT, Env, endpoint, loadavg, machine, pinned, rnd, save  # noqa: E402
import tiering.ops.offload as offload_mod  # noqa: E402
import tiering.tier2.offloader as offloader_mod  # noqa: E402


class Timeline:
    """Named marks in ms from the start of the current run."""

    def __init__(self):
        self.marks: list[tuple[str, float]] = []
        self.t0 = 0.0

    def start(self) -> None:
        self.marks, self.t0 = [], time.perf_counter()

    def mark(self, name: str) -> None:
        self.marks.append((name, (time.perf_counter() - self.t0) * 1000))

    def around(self, owner, attr: str, label: str) -> None:
        """Mark `label<` and `label>` around every call of owner.attr."""
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            self.mark(label + "<")
            try:
                return fn(*args, **kwargs)
            finally:
                self.mark(label + ">")
        setattr(owner, attr, timed)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=16)
    ap.add_argument("--runs", type=int, default=11)
    ap.add_argument("--entry-size", type=int, default=4096)
    ap.add_argument("--pin", action="store_true", help="the Ceph daemons on CPU 0, this process on the others")
    ap.add_argument("--quick", action="store_true", help="5 runs")
    ap.add_argument("--private-moto", action="store_true", help="a moto server of its own (no timeline worth "
                                                                 "reading: for checking the script)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.runs = min(args.runs, 5)
    started, load_before = time.perf_counter(), loadavg()
    tl = Timeline()
    tl.around(offload_mod, "check_bucket", "head")
    tl.around(offloader_mod, "put_bytes", "index")
    packer = offloader_mod.pack_runs

    def packing(*args, **kwargs):
        for block in packer(*args, **kwargs):
            tl.mark("packed")
            yield block
    offloader_mod.pack_runs = packing
    ours, peer, runs = [], [], []
    with endpoint(args.private_moto) as url, pinned(url, args.pin) as pinning:
        print(pinning)
        env = Env(url)
        tl.around(env.deps.meta, "begin_offload_batch", "begin")
        tl.around(env.deps.meta, "complete_offload_batch", "commit")
        config = transfer_config()
        try:
            for r in range(args.runs):
                _, leds, paths = env.write_ledgers(f"timeline-{args.size_mib}", 1, args.size_mib * MIB,
                                                   args.entry_size)

                def run_ours():
                    tl.start()
                    report = offload_mod.offload_many(env.deps, leds, hook=tl.mark)
                    ours.append((time.perf_counter() - tl.t0) * 1000)
                    assert report.offloaded, report
                    runs.append(list(tl.marks))

                def run_peer():
                    t0 = time.perf_counter()
                    env.s3.upload_file(str(paths[0]), env.bucket, f"peer/{r}", ExtraArgs=UPLOAD_EXTRA, Config=config)
                    peer.append((time.perf_counter() - t0) * 1000)

                for fn in ((run_ours, run_peer) if r % 2 else (run_peer, run_ours)):  # who goes first alternates
                    fn()
                    env.reset()
                for p in paths:
                    p.unlink()
        finally:
            env.close()
    ours_ms, peer_ms = statistics.median(ours), statistics.median(peer)
    at = defaultdict(list)
    for marks in runs:
        seen = defaultdict(int)
        for name, ms in marks:
            seen[name] += 1
            at[f"{name}#{seen[name]}" if name in ("part", "packed") else name].append(ms)
    timeline = {name: rnd(statistics.median(values), 1)
                for name, values in sorted(at.items(), key=lambda kv: statistics.median(kv[1]))}
    result = {"when": datetime.now(timezone.utc).isoformat(timespec="seconds"), "machine": machine(),
              "pinning": str(pinning), "load_before": load_before, "load_after": loadavg(),
              "size_mib": args.size_mib, "entry_size": args.entry_size, "runs": args.runs,
              "offload_ms": [rnd(x, 1) for x in ours], "upload_file_ms": [rnd(x, 1) for x in peer],
              "ratio_upload_file_over_offload": rnd(peer_ms / ours_ms, 3), "timeline_median_ms": timeline,
              "seconds": rnd(time.perf_counter() - started)}
    md = (f"# One {args.size_mib} MiB offload against upload_file, and its timeline ({result['when']}; "
          f"{result['pinning']}; load {load_before} -> {result['load_after']})\n\n"
          f"{args.runs} runs each, alternating: offload {ours_ms:.0f} ms, upload_file {peer_ms:.0f} ms (medians), "
          f"ratio **{peer_ms / ours_ms:.3f}**.\n\n| step | ms from the call (median) |\n|---|---:|\n" +
          "".join(f"| {name} | {ms} |\n" for name, ms in timeline.items()) + "\n")
    save(args.out, "offload_timeline", result, md, "bench_offload_timeline.py", args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
