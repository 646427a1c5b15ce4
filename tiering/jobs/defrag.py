"""Spark job: merge runs of small tier-2 objects; one merge group per item."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import run, topic_arg
from tiering.jobs.spec import size_arg
from tiering.model import INT64_MAX
from tiering.model import MIB
from tiering.ops.defrag import DefragReport, merge_group, plan_defrag


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-defrag")
    topic_arg(p)
    p.add_argument("--small-bytes", type=size_arg("--small-bytes", 1, INT64_MAX), default=8 * MIB)
    p.add_argument("--max-merged-bytes", type=size_arg("--max-merged-bytes", 1, INT64_MAX), default=256 * MIB)
    return p


def plan(deps, args) -> list[dict]:
    return [{"group": g} for g in plan_defrag(deps, args.topic, args.small_bytes, args.max_merged_bytes)]


def work(deps, item) -> tuple[int, bool]:
    group = item["group"]
    merged = merge_group(deps, group, DefragReport())
    return (group.data_bytes, False) if merged else (0, True)


def main(argv=None) -> int:
    return run("defrag", argv, build_parser(), plan, work, tier1=False)


if __name__ == "__main__":
    sys.exit(main())
