"""Spark job: offload by age, by size, or Pulsar's offloadPrefix (`--prefix=TOPIC --position=L:E`, or
`--position=all`: every sealed ledger)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from tiering.errors import BadInput, TieringError
from tiering.jobs.runner import ledger_item, run, topic_arg
from tiering.jobs.spec import ALL_SEALED, prefix_position_arg, size_arg
from tiering.model import LedgerState
from tiering.ops import offload
from tiering.ops.offload_batch import batches
from tiering.model import INT64_MAX
from tiering.tier2 import throttle
from tiering.tier2.objects import check_bucket


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tiering-offload")
    p.add_argument("--by", choices=["age", "size"])
    p.add_argument("--prefix", metavar="TOPIC", help="offloadPrefix: the topic")
    p.add_argument("--position", type=prefix_position_arg, metavar="L:E",
                   help=f"offloadPrefix: offload every sealed ledger before it ({ALL_SEALED!r}: every sealed ledger)")
    p.add_argument("--max-bytes-per-second", type=size_arg("--max-bytes-per-second", 0, INT64_MAX), default=None,
                   metavar="N", help="upload limit of the whole job, split across its tasks (default: "
                                     "TIERING_OFFLOAD_MAX_BYTES_PER_SECOND; 0: unlimited)")
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
        position = offload.end_of_sealed(deps, args.prefix) if args.position == ALL_SEALED else args.position
        return _items(deps, offload.plan_offload_prefix(deps, args.prefix, position))
    if args.by is None:
        raise BadInput("give --by age|size or --prefix TOPIC --position L:E")
    return _items(deps, offload.plan_offload(deps, args.by, args.topic))


def _items(deps, targets) -> list[dict]:
    """One item per large ledger, one per batch of a topic's small ledgers (one object pair each)."""
    k = deps.knobs
    groups, alone = batches(targets, k.batch_small_bytes, k.batch_max_bytes, k.batch_max_ledgers) \
        if k.batch_small_bytes > 0 else ([], targets)
    return [{"topic": g[0].topic, "ledger_ids": [led.ledger_id for led in g]} for g in groups] + \
        [ledger_item(led) for led in alone]


def share_budget(deps, args, items: list[dict], parallelism: int) -> list[dict]:
    """The job-wide upload limit (--max-bytes-per-second, else TIERING_OFFLOAD_MAX_BYTES_PER_SECOND) split
    across the tasks that run at once (the runner calls this on the driver once Spark is up): each item
    carries its task's share, so the executors together stay under the limit."""
    total = args.max_bytes_per_second if args.max_bytes_per_second is not None else deps.knobs.max_bytes_per_second
    if total <= 0:
        return items
    share = throttle.split(total, min(len(items), parallelism))
    return [{**item, "max_bytes_per_second": share} for item in items]


def work(deps, item) -> tuple[int, bool]:
    """One item: a ledger, or a batch of a topic's small ledgers, offloaded by offload_many (a failed batch's
    ledgers one by one; skipped only what another worker holds or finished). Any ledger failed: the item
    fails (after all of them were tried), and its retry takes on what is still not offloaded."""
    if "max_bytes_per_second" in item:  # this task's share of the job's limit (share_budget)
        deps = replace(deps, knobs=replace(deps.knobs, max_bytes_per_second=item["max_bytes_per_second"]))
    ids = item["ledger_ids"] if "ledger_ids" in item else [item["ledger_id"]]
    leds = [deps.meta.get_ledger(item["topic"], i) for i in ids]
    todo = [led for led in leds if led.state in (LedgerState.SEALED, LedgerState.OFFLOADING) and led.entry_count]
    if not todo:
        return 0, True  # done or changed since planning
    report = offload.offload_many(deps, todo, bucket_checked=True)  # plan() checked tier 2 once for the run
    if report.failed:
        raise TieringError(f"{len(report.failed)} of {len(todo)} ledger(s) not offloaded; first: {report.first_error}")
    return report.bytes, not report.offloaded


def lost(deps, items: list[dict]) -> list[str]:
    """The planned ledgers of items no executor reported failed that are still not offloaded at the end of
    the run: an attempt whose worker died (an executor lost with its node, its task's retry elsewhere then
    finding the ledger OFFLOADED or still held) or a ledger another worker gave back. OFFLOADING under a live
    attempt is another worker's: not counted. Reads the planned rows only, in one statement."""
    pairs = [(i["topic"], lid) for i in items for lid in (i["ledger_ids"] if "ledger_ids" in i else [i["ledger_id"]])]
    out = []
    for led, gone in deps.meta.planning.unfinished_offloads(pairs):
        if led.state == LedgerState.SEALED:
            out.append(f"ledger {led.topic}/{led.ledger_id} is still SEALED after the run: not offloaded")
        elif gone:
            out.append(f"ledger {led.topic}/{led.ledger_id}: its offload attempt {led.offload_uuid} lost its worker "
                       f"(an executor that died): left OFFLOADING, the next run takes it over at once")
    return out


def main(argv=None) -> int:
    return run("offload", argv, build_parser(), plan, work, kind=kind, prepare=share_budget, check=lost)


def kind(args) -> str:
    return "offload_prefix" if args.prefix is not None else f"offload_by_{args.by}"


if __name__ == "__main__":
    sys.exit(main())
