"""Spark job: retention by time and size, one topic per item (a topic's truncation is one transaction)."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import run, topic_arg
from tiering.ops.retention import apply_retention, plan_retention


def plan(deps, args) -> list[dict]:
    return [{"topic": name} for name in plan_retention(deps, args.topic)]


def work(deps, item) -> tuple[int, bool]:
    # re-planned: the freshest view wins (nothing due any more: the marker and leftover copies still checked)
    doomed = plan_retention(deps, item["topic"]).get(item["topic"], [])
    report = apply_retention(deps, item["topic"], doomed)
    return report.bytes, not report.deleted and not report.files_removed


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-retention")
    topic_arg(p)
    return p


def main(argv=None) -> int:
    return run("retention", argv, build_parser(), plan, work)


if __name__ == "__main__":
    sys.exit(main())
