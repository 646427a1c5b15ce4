"""Spark job: offload by age, by size, or Pulsar's offloadPrefix (`--prefix=TOPIC --position=L:E`)."""
from __future__ import annotations

import argparse
import sys

from tiering.errors import BadInput
from tiering.jobs.runner import ledger_item, run, topic_arg
from tiering.jobs.spec import position_arg
from tiering.model import LedgerState
from tiering.ops import offload
from tiering.tier2.objects import check_bucket


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-offload")
    p.add_argument("--by", choices=["age", "size"])
    p.add_argument("--prefix", metavar="TOPIC", help="offloadPrefix: the topic")
    p.add_argument("--position", type=position_arg, metavar="L:E", help="offloadPrefix: offload every sealed ledger before it")
    topic_arg(p)
    return p


def plan(deps, args) -> list[dict]:
    items = _plan(deps, args)
    if items:
        check_bucket(deps.bucket)  # tier 2 down: the run fails here, before executors touch any ledger
    return items


def _plan(deps, args) -> list[dict]:
    if args.prefix is not None:
        if args.position is None:
            raise BadInput("--prefix needs --position L:E")
        position = args.position
        ledgers = deps.meta.list_ledgers(args.prefix)
        from tiering import policy

        targets = policy.offload_prefix(ledgers, position)
        targets += [led for led in deps.meta.stale_offloads(deps.knobs.offload_timeout, args.prefix)
                    if led.ledger_id < position.ledger_id]
        return [ledger_item(led) for led in targets]
    if args.by is None:
        raise BadInput("give --by age|size or --prefix TOPIC --position L:E")
    return [ledger_item(led) for led in offload.plan_offload(deps, args.by, args.topic)]


def work(deps, item) -> tuple[int, bool]:
    led = deps.meta.get_ledger(item["topic"], item["ledger_id"])
    if led.state not in (LedgerState.SEALED, LedgerState.OFFLOADING) or led.entry_count == 0:
        return 0, True  # done or changed since planning
    return offload.offload_ledger(deps, led).size_bytes, False


def main(argv=None) -> int:
    return run("offload", argv, build_parser(), plan, work, kind=kind)


def kind(args) -> str:
    return "offload_prefix" if args.prefix is not None else f"offload_by_{args.by}"


if __name__ == "__main__":
    sys.exit(main())
