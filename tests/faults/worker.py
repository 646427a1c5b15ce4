"""Fault-injection worker: run ONE pipeline operation against the run's services and stop dead at a named
point, so the test can SIGKILL it exactly there.

    python -m tests.faults.worker OP        OP: offload | offload+delete-lagged | delete-lagged |
                                                retention | defrag | gc | gc-sweep | repair | recover

Settings come from the environment as in production (`Settings.from_env`: TIERING_DATABASE_URL,
TIERING_BUCKET, TIERING_PREFIX, TIERING_TIER1_ROOT, TIERING_S3_ENDPOINT_URL, TIERING_BLOCK_SIZE,
TIERING_UPLOAD_CONCURRENCY, AWS_*), plus:

    FAULT_TOPICS           JSON list of the topics the operation works on
    FAULT_POINT            where to stop (see `Stopper`); unset: run to completion
    FAULT_OFFLOAD_TIMEOUT  Knobs.offload_timeout in seconds (default 1)
    FAULT_GC_DELAY         Knobs.gc_delay in seconds (default 0)
    FAULT_GC_BATCH         gc batch size (default 500)
    FAULT_GO_FILE          wait until this file exists before starting (races start together)
    FAULT_BATCH_BYTES      Knobs.batch_small_bytes (default 0: one ledger per attempt; > 0: small ledgers of
                           a topic offloaded as one batch, tiering/ops/offload_batch.py)

Protocol on stdout, one line each, flushed: `READY` once the clients are built, `AT <point>` when the
point is reached (the worker then sleeps until killed), `DONE <json report>` when the operation finished.
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta

from tiering.model import LedgerState

OPS = ("offload", "offload+delete-lagged", "delete-lagged", "retention", "defrag", "gc", "gc-sweep", "repair",
       "recover")


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def offload_targets(deps, topics: list[str]):
    """What a scheduled offload run takes on: the topics' sealed non-empty ledgers plus attempts older
    than the offload timeout (their worker is presumed dead), each once."""
    seen, out = set(), []
    stale = deps.meta.stale_offloads(deps.knobs.offload_timeout)
    for led in [led for t in topics for led in deps.meta.list_ledgers(t, [LedgerState.SEALED])] + \
            [led for led in stale if led.topic in topics]:
        if led.entry_count > 0 and (led.topic, led.ledger_id) not in seen:
            seen.add((led.topic, led.ledger_id))
            out.append(led)
    return sorted(out, key=lambda x: (x.topic, x.ledger_id))


def run_op(deps, op: str, topics: list[str], hook=None, on_done=None, gc_batch: int = 500,
           reverse: bool = False) -> dict:
    """Run one operation to completion over `topics`; the same code the test uses for its in-process rerun.
    Returns a JSON-able report naming (topic, ledger) pairs."""
    from tiering.ops.defrag import defrag
    from tiering.ops.delete_lagged import delete_lagged
    from tiering.ops.gc import run_gc
    from tiering.ops.offload import offload_many
    from tiering.ops.retention import retention

    out: dict = {"op": op}
    if op in ("offload", "offload+delete-lagged"):
        out.update(offloaded=[], skipped=[], failed={})
        for t in topics:  # one topic at a time: offload_many reports ledger ids only
            targets = offload_targets(deps, [t])
            if reverse:
                targets.reverse()
            r = offload_many(deps, targets, hook, on_done)
            out["offloaded"] += [[t, i] for i in r.offloaded]
            out["skipped"] += [[t, i] for i in r.skipped]
            out["failed"].update({f"{t}/{i}": m for i, m in r.failed.items()})
    if op in ("offload+delete-lagged", "delete-lagged"):
        out["deleted"] = [list(x) for t in topics for x in delete_lagged(deps, t).deleted]
    elif op == "retention":
        out["deleted"] = [list(x) for t in topics for x in retention(deps, t).deleted]
    elif op == "defrag":
        reports = [defrag(deps, t, small_bytes=8 * 1024 * 1024, max_merged_bytes=64 * 1024 * 1024, hook=hook)
                   for t in topics]
        out["groups"] = sum(r.groups for r in reports)
        out["lost_races"] = sum(r.lost_races for r in reports)
    elif op == "gc":
        r = run_gc(deps, batch=gc_batch, orphan_grace=timedelta(0))
        out["deleted"] = r.deleted
        out["failed"] = r.failed
    elif op == "gc-sweep":  # pages of 2 keys: the kill lands between one page's deletes and its cursor move
        from tiering.ops.gc import sweep_orphans

        r = sweep_orphans(deps, orphan_grace=timedelta(0), page_keys=2)
        out.update(deleted=r.orphans_deleted, failed=r.failed, taken=r.taken, pass_complete=r.pass_complete)
    elif op == "repair":
        from tiering.ops.repair import repair

        reports = [repair(deps, t, hook=hook) for t in topics]
        out.update(repaired=[list(x) for r in reports for x in r.repaired], lost=[list(x) for r in reports for x in r.lost],
                   skipped=[list(x) for r in reports for x in r.skipped], failed=[f for r in reports for f in r.failed],
                   recovered=[list(x) for r in reports for x in r.recovered])
    elif op == "recover":  # every topic of the bucket and tier 1, one after the other
        from tiering.ops.recover import recover_from_bucket

        r = recover_from_bucket(deps.meta.engine, deps.bucket, tier1=deps.tier1, topic_concurrency=1)
        out.update(recovered=[list(x) for x in r.ledgers_recovered], lost=[list(x) for x in r.lost_recorded],
                   errors=r.errors)
    elif op not in OPS:
        raise SystemExit(f"unknown op {op!r}; expected one of {', '.join(OPS)}")
    return out


class Stopper:
    """Stops the process dead (announce, then sleep until killed) at one point:

    step:NAME[:N]              the StepHook reaching NAME for the N-th time (offload: initiated, part,
                               completed, index; defrag: part, merged; repair: queued, the offload's,
                               checked, committed, marking-lost, marked-lost, recovering, recovered)
    commit-after-step:NAME     the first metadata COMMIT after step NAME, inside the open transaction
                               (offload: after `index` that is complete_offload's commit)
    commit:N                   the N-th metadata COMMIT, inside its open transaction (recover: one per topic)
    done[:N]                   after the N-th ledger's offload committed (offload_many's on_done)
    s3:before|after:OP[:N]     botocore before-call/after-call of the N-th S3 call OP (`*`: any call)
    tier1-delete:before|after  around the first step of a tier-1 copy deletion (renaming it to its tombstone)
    meta-after:METHOD          after MetadataStore.METHOD returned (its transaction committed)
    meta-before:METHOD         when MetadataStore.METHOD is called, before it runs (nothing of it committed)
    """

    def __init__(self, spec: str | None):
        self.spec = spec or ""
        self.kind = self.spec.partition(":")[0]
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self.armed_commit = False

    def stop(self) -> None:
        say(f"AT {self.spec}")
        while True:  # the test kills us here
            time.sleep(3600)

    def _nth(self, key: str, n: int) -> bool:
        with self.lock:
            self.counts[key] = self.counts.get(key, 0) + 1
            return self.counts[key] == n

    # -- StepHook
    def hook(self, name: str) -> None:
        if self.kind == "step":
            want, _, n = self.spec.split(":", 1)[1].partition(":")
            if name == want and self._nth(name, int(n or 1)):
                self.stop()
        elif self.kind == "commit-after-step" and name == self.spec.split(":", 1)[1]:
            self.armed_commit = True

    def install(self, deps) -> None:
        from sqlalchemy import event

        if self.kind == "commit":
            @event.listens_for(deps.meta.engine, "commit")
            def _on_nth_commit(_conn):
                if self._nth("commit", int(self.spec.partition(":")[2])):
                    self.stop()
        elif self.kind == "commit-after-step":
            @event.listens_for(deps.meta.engine, "commit")
            def _on_commit(_conn):
                if self.armed_commit:
                    self.stop()
        elif self.kind == "s3":
            when, _, rest = self.spec.split(":", 1)[1].partition(":")
            op, _, n = rest.partition(":")
            event_name = f"{when}-call.s3" + ("" if op == "*" else f".{op}")

            def _on_call(**_kwargs):
                if self._nth(event_name, int(n or 1)):
                    self.stop()

            deps.bucket.s3.meta.events.register(event_name, _on_call)
        elif self.kind == "tier1-delete":
            when = self.spec.split(":", 1)[1]
            original = deps.tier1.retire

            def delete(topic, ledger_id):
                if when == "before":
                    self.stop()
                gone = original(topic, ledger_id)
                if when == "after":
                    self.stop()
                return gone

            deps.tier1.retire = delete
        elif self.kind in ("meta-after", "meta-before"):
            method = self.spec.split(":", 1)[1]
            original = getattr(deps.meta, method)

            def wrapped(*args, **kwargs):
                if self.kind == "meta-before":
                    self.stop()
                result = original(*args, **kwargs)
                self.stop()
                return result

            setattr(deps.meta, method, wrapped)

    def on_done(self, _led) -> None:
        if self.kind == "done" and self._nth("done", int(self.spec.partition(":")[2] or 1)):
            self.stop()


def build_deps():
    from tiering import clients
    from tiering.config import Settings
    from tiering.ops.context import Knobs

    s = Settings.from_env()
    knobs = Knobs.from_settings(s,
                                offload_timeout=timedelta(seconds=float(os.environ.get("FAULT_OFFLOAD_TIMEOUT", "1"))),
                                gc_delay=timedelta(seconds=float(os.environ.get("FAULT_GC_DELAY", "0"))),
                                batch_small_bytes=int(os.environ.get("FAULT_BATCH_BYTES", "0")))
    return clients.deps(s, knobs=knobs)


def main(argv: list[str]) -> int:
    if len(argv) != 1 or argv[0] not in OPS:
        sys.stderr.write(f"usage: python -m tests.faults.worker {{{'|'.join(OPS)}}}\n")
        return 2
    op = argv[0]
    topics = json.loads(os.environ["FAULT_TOPICS"])
    deps = build_deps()
    stopper = Stopper(os.environ.get("FAULT_POINT"))
    stopper.install(deps)
    deps.meta.now()  # connect now: READY means the clients work
    say("READY")
    go = os.environ.get("FAULT_GO_FILE")
    while go and not os.path.exists(go):
        time.sleep(0.005)
    report = run_op(deps, op, topics, stopper.hook, stopper.on_done, int(os.environ.get("FAULT_GC_BATCH", "500")),
                    reverse=os.environ.get("FAULT_REVERSE") == "1")
    say("DONE " + json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
