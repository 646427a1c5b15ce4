"""Spark job: delete tier-1 copies whose offload is older than the topic's deletion lag."""
from __future__ import annotations

import argparse
import sys

from tiering.jobs.runner import ledger_item, run, topic_arg
from tiering.ops.delete_lagged import delete_copy, plan_delete_lagged


def plan(deps, args) -> list[dict]:
    return [{**ledger_item(led), "version": led.version} for led in plan_delete_lagged(deps, args.topic)]


def work(deps, item) -> tuple[int, bool]:
    led = deps.meta.get_ledger(item["topic"], item["ledger_id"])
    if led.version != item["version"]:
        return 0, True
    return (led.size_bytes, False) if delete_copy(deps, led) else (0, True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-delete-lagged")
    topic_arg(p)
    return p


def main(argv=None) -> int:
    return run("delete_lagged", argv, build_parser(), plan, work)


if __name__ == "__main__":
    sys.exit(main())
