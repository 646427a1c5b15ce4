"""Handlers of the `tiering` command (parsing is in cli.py)."""
from __future__ import annotations

import sys
from dataclasses import asdict
from functools import cached_property

from tiering.cli import b64, print_json
from tiering.config import Settings
from tiering.errors import BadInput


class Context:
    """Clients built once from the environment (config.py is the only reader of it)."""

    @cached_property
    def settings(self) -> Settings:
        return Settings.from_env()

    @cached_property
    def engine(self):
        return self.settings.engine()

    @cached_property
    def meta(self):
        from tiering.metadata.repository import MetadataStore

        return MetadataStore(self.engine)

    @cached_property
    def tier1(self):
        from tiering.tier1 import Tier1Store

        return Tier1Store(self.settings.tier1_root)

    @cached_property
    def bucket(self):
        from tiering.tier2.objects import Bucket

        return Bucket(self.settings.s3_client(), self.settings.bucket, self.settings.prefix)

    @cached_property
    def deps(self):
        from tiering.ops.context import Deps, Knobs

        knobs = Knobs(block_size=self.settings.block_size, upload_concurrency=self.settings.upload_concurrency)
        return Deps(self.meta, self.tier1, self.bucket, knobs)


def describe_failure(exc: Exception) -> str:
    """One line for an unexpected failure; never a URL with a password."""
    from sqlalchemy.exc import OperationalError, ProgrammingError

    if isinstance(exc, OperationalError):
        return "cannot reach the metadata database (check TIERING_DATABASE_URL; is it running?)"
    if isinstance(exc, ProgrammingError) and "does not exist" in str(exc.orig):
        return "the metadata schema is missing or old: run `tiering db upgrade`"
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            return f"S3 {exc.operation_name} failed: {err.get('Code')} {err.get('Message', '')}".strip()
        if isinstance(exc, BotoCoreError):
            return f"S3 is unreachable or misconfigured: {type(exc).__name__}"
    except ImportError:
        pass
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def dispatch(args) -> int:
    ctx = Context()
    handler = HANDLERS[args.command]
    return handler(ctx, args) or 0


def cmd_db(ctx: Context, args) -> int:
    from tiering.metadata.migrations import upgrade

    result = upgrade(ctx.engine)
    print(f"schema tiering: applied {len(result.applied)} migration(s) {', '.join(result.applied) or ''}".rstrip()
          + f"; {len(result.already)} already applied; {len(result.views)} views")
    return 0


def _topic_dict(t) -> dict:
    return {"name": t.name, "topic_id": t.topic_id, "next_ledger_id": t.next_ledger_id, "version": t.version,
            **asdict(t.policy)}


def cmd_topic(ctx: Context, args) -> int:
    from tiering.model import TopicPolicy

    if args.topic_command == "create":
        policy = TopicPolicy(args.offload_after, args.offload_threshold, args.deletion_lag, args.retention_time,
                             args.retention_size, args.rollover_entries, args.rollover_bytes)
        _check_name(args.name)
        t = ctx.meta.create_topic(args.name, policy)
        print(f"created topic {t.name}")
    elif args.topic_command == "list":
        topics = ctx.meta.list_topics()
        for t in topics:
            print_json(_topic_dict(t)) if args.json else print(t.name)
    else:
        t = ctx.meta.get_topic(args.name)
        if args.json:
            print_json(_topic_dict(t))
        else:
            for k, v in _topic_dict(t).items():
                print(f"{k:24} {v}")
    return 0


def _check_name(name: str) -> None:
    if not name or len(name) > 1024 or "\x00" in name:
        raise BadInput("a topic name is 1 to 1024 characters without NUL")


def cmd_produce(ctx: Context, args) -> int:
    from tiering.workload import payload
    from tiering.writer import ManagedLedgerWriter

    if args.entries is not None and args.entry_size is None:
        raise BadInput("--entries needs --entry-size")
    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name)
    last = None
    try:
        if args.stdin_lines:
            for line in sys.stdin.buffer:
                last = writer.append(line[:-1] if line.endswith(b"\n") else line)
        else:
            for seq in _progress(range(args.entries), "produce", sys.stderr):
                last = writer.append(payload(args.seed, seq, args.entry_size))
        if args.seal:
            writer.seal()
    finally:
        writer.close()
    print(str(last) if last is not None else "nothing written")
    return 0


def cmd_seal(ctx: Context, args) -> int:
    from tiering.writer import ManagedLedgerWriter

    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name)
    sealed = writer.seal()
    print(f"sealed ledger {sealed.ledger_id} ({sealed.entry_count} entries)" if sealed else "no open ledger")
    return 0


def ledger_status(ctx: Context, name: str) -> list[dict]:
    from tiering.model import LedgerState

    rows = []
    for led in ctx.meta.list_ledgers(name):
        entries, size = led.entry_count, led.size_bytes
        if led.state == LedgerState.OPEN and ctx.tier1.exists(name, led.ledger_id):
            with ctx.tier1.reader(name, led.ledger_id) as r:
                entries, size = r.entry_count, r.size_bytes
        tiers = ([1] if led.tier1_present and led.state != LedgerState.DELETED else []) + \
                ([2] if led.state == LedgerState.OFFLOADED else [])
        rows.append({"ledger": led.ledger_id, "state": led.state.value, "entries": entries, "bytes": size,
                     "tiers": tiers, "sealed_at": led.sealed_at, "offloaded_at": led.offloaded_at})
    return rows


def cmd_status(ctx: Context, args) -> int:
    rows = ledger_status(ctx, args.name)
    if args.json:
        for r in rows:
            print_json(r)
        return 0
    print(f"{'ledger':>8} {'state':<11} {'entries':>9} {'bytes':>12}  tiers")
    for r in rows:
        print(f"{r['ledger']:>8} {r['state']:<11} {r['entries']:>9} {r['bytes']:>12}  "
              f"{'+'.join(map(str, r['tiers'])) or '-'}")
    return 0


def cmd_read(ctx: Context, args) -> int:
    from tiering.read import Gap, ReadHandle

    from tiering.tier2.reader import tier2_opener

    handle = ReadHandle(ctx.meta, ctx.tier1, open_tier2=tier2_opener(ctx.bucket),
                        raise_on_dataloss=args.fail_on_dataloss)
    out = sys.stdout
    for item in handle.read(args.name, args.start, args.end):
        if isinstance(item, Gap):
            print_json({"gap": item.kind, "from": str(item.start), "to": str(item.end)})
        elif args.json:
            print_json({"ledger": item.ledger_id, "entry": item.entry_id, "data": b64(item.data)})
        else:
            out.write(f"{item.ledger_id}:{item.entry_id}\t{item.data.decode('utf-8', 'backslashreplace')}\n")
    return 0


def cmd_offload_prefix(ctx: Context, args) -> int:
    from tiering.ops.offload import offload_prefix

    report, first = offload_prefix(ctx.deps, args.name, args.position)
    result = {"topic": args.name, "offloaded": report.offloaded, "skipped": report.skipped,
              "failed": report.failed, "bytes": report.bytes, "first_not_offloaded": str(first)}
    if args.json:
        print_json(result)
    else:
        print(f"offloaded {len(report.offloaded)} ledger(s) ({report.bytes} bytes), skipped "
              f"{len(report.skipped)}, failed {len(report.failed)}; first position not offloaded: {first}")
    if report.first_error:
        sys.stderr.write(f"tiering: error: {len(report.failed)} ledger(s) failed; first: {report.first_error}\n")
        return 1
    return 0


def cmd_offload_status(ctx: Context, args) -> int:
    chunks = ctx.meta.chunks(args.name)
    rows = []
    for led in ctx.meta.list_ledgers(args.name):
        ch = chunks.get(led.ledger_id)
        rows.append({"ledger": led.ledger_id, "state": led.state.value, "attempt": led.offload_uuid,
                     "offload_started_at": led.offload_started_at, "offloaded_at": led.offloaded_at,
                     "tier1_present": led.tier1_present,
                     "data_key": ch.data_key if ch else None, "index_key": ch.index_key if ch else None})
    if args.json:
        for r in rows:
            print_json(r)
        return 0
    print(f"{'ledger':>8} {'state':<11} {'offloaded_at':<32} keys")
    for r in rows:
        print(f"{r['ledger']:>8} {r['state']:<11} {str(r['offloaded_at'] or '-'):<32} {r['data_key'] or '-'}")
    return 0


def _progress(iterable, desc: str, stream):
    """tqdm progress when attached to a terminal; the bare iterable otherwise."""
    if not stream.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, file=stream, unit="entry")


HANDLERS = {"db": cmd_db, "topic": cmd_topic, "produce": cmd_produce, "seal": cmd_seal, "status": cmd_status,
            "read": cmd_read,
            "offload-prefix": cmd_offload_prefix, "offload-status": cmd_offload_status}
