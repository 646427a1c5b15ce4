"""Spark job: merge runs of small tier-2 objects; one merge group per item."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import run, topic_arg
from tiering.jobs.spec import size_arg
from tiering.model import INT64_MAX
from tiering.model import MIB
from tiering.ops.defrag import DefragReport, merge_replanning, plan_defrag


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-defrag")
    topic_arg(p)
    p.add_argument("--small-bytes", type=size_arg("--small-bytes", 1, INT64_MAX), default=8 * MIB)
    p.add_argument("--max-merged-bytes", type=size_arg("--max-merged-bytes", 1, INT64_MAX), default=256 * MIB)
    return p


def plan(deps, args) -> list[dict]:
    return [{"group": g, "small_bytes": args.small_bytes, "max_merged_bytes": args.max_merged_bytes}
            for g in plan_defrag(deps, args.topic, args.small_bytes, args.max_merged_bytes)]


def work(deps, item) -> tuple[int, bool]:
    """Skipped only when another worker merged the group's ledgers or they went (merge_replanning)."""
    group = item["group"]
    merged = merge_replanning(deps, group, DefragReport(), item["small_bytes"], item["max_merged_bytes"])
    return (group.data_bytes, False) if merged else (0, True)


def main(argv=None) -> int:
    return run("defrag", argv, build_parser(), plan, work, tier1=False)


if __name__ == "__main__":
    sys.exit(main())
