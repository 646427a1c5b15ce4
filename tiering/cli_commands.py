"""Handlers of the `tiering` command: topics, writes, reads (parsing is in cli.py, pipeline commands in
cli_ops.py)."""
from __future__ import annotations

import sys
from dataclasses import asdict
from functools import cached_property

from tiering.cli import b64, print_json
from tiering.config import Settings
from tiering.errors import BadInput, ConfigError, LedgerStorageError


class Context:
    """Clients built once from the environment (config.py is the only reader of it)."""

    @cached_property
    def settings(self) -> Settings:
        return Settings.from_env()

    @cached_property
    def engine(self):
        from sqlalchemy.exc import ArgumentError

        try:
            return self.settings.engine()
        except (ArgumentError, ValueError):  # e.g. a port that is not a number; the message may hold the URL
            raise ConfigError("TIERING_DATABASE_URL is malformed: expected "
                              "postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None

    @cached_property
    def meta(self):
        engine = self.engine  # settings first: a configuration mistake is reported before heavy imports
        from tiering.metadata.repository import MetadataStore

        return MetadataStore(engine)

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

        knobs = Knobs(block_size=self.settings.block_size, upload_concurrency=self.settings.upload_concurrency,
                      offload_timeout=self.settings.offload_timeout, gc_delay=self.settings.gc_delay,
                      page_size=self.settings.page_size,
                      batch_small_bytes=self.settings.offload_batch_bytes)
        return Deps(self.meta, self.tier1, self.bucket, knobs)

    def close(self) -> None:
        if "engine" in self.__dict__:
            self.engine.dispose()


def describe_failure(exc: Exception) -> str:
    """One line for an unexpected failure; never a URL with a password (cli.error redacts on top)."""
    from sqlalchemy.exc import DBAPIError, OperationalError, ProgrammingError, SQLAlchemyError

    first = _first_line
    if isinstance(exc, ProgrammingError) and "does not exist" in str(exc.orig):
        return "the metadata schema is missing or old: run `tiering db upgrade`"
    if isinstance(exc, OperationalError):
        return f"metadata database unavailable (check TIERING_DATABASE_URL; is it running?): {first(exc.orig)}"
    if isinstance(exc, DBAPIError):
        return f"metadata database error: {type(exc.orig).__name__}: {first(exc.orig)}"
    if isinstance(exc, SQLAlchemyError):
        return f"metadata database error: {type(exc).__name__}"
    try:
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, ClientError):
            err = exc.response.get("Error", {})
            return f"S3 {exc.operation_name} failed: {err.get('Code')} {err.get('Message', '')}".strip()
        if isinstance(exc, BotoCoreError):
            return f"S3 is unreachable or misconfigured (check TIERING_S3_ENDPOINT_URL): {first(exc)}"
    except ImportError:
        pass
    return f"{type(exc).__name__}: {first(exc)}".rstrip(": ")


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else ""


def dispatch(args) -> int:
    from tiering import cli_meta, cli_ops

    handler = {**HANDLERS, **cli_ops.HANDLERS, **cli_meta.HANDLERS}[args.command]
    ctx = Context()
    try:
        return handler(ctx, args) or 0
    finally:
        ctx.close()


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
        t = ctx.meta.create_topic(args.name, policy)
        print(f"created topic {t.name!r}")
    elif args.topic_command == "list":
        for t in ctx.meta.list_topics():
            print_json(_topic_dict(t)) if args.json else print(t.name)
    else:
        t = ctx.meta.get_topic(args.name)
        if args.json:
            print_json(_topic_dict(t))
        else:
            for k, v in _topic_dict(t).items():
                print(f"{k:24} {v}")
    return 0


def cmd_produce(ctx: Context, args) -> int:
    from tiering.workload import payload
    from tiering.writer import MAX_ENTRY_BYTES, ManagedLedgerWriter

    if args.entries is not None and args.entry_size is None:
        raise BadInput("--entries needs --entry-size")
    if args.stdin_lines and args.entry_size is not None:
        raise BadInput("--entry-size goes with --entries, not --stdin-lines")
    if args.entry_size is not None and args.entry_size > MAX_ENTRY_BYTES:
        raise BadInput(f"--entry-size is at most {MAX_ENTRY_BYTES} bytes")
    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name)  # an unknown topic fails here
    last, count = None, 0
    try:
        if args.stdin_lines:
            for line in sys.stdin.buffer:
                last = writer.append(line[:-1] if line.endswith(b"\n") else line)
                count += 1
        else:
            for seq in _progress(range(args.entries), "produce", sys.stderr, unit="entry"):
                last = writer.append(payload(args.seed, seq, args.entry_size))
                count += 1
        if args.seal:
            writer.seal()
    finally:
        writer.close()
    print(str(last) if last is not None else "nothing written")
    return 0


def cmd_seal(ctx: Context, args) -> int:
    from tiering.writer import ManagedLedgerWriter

    writer = ManagedLedgerWriter(ctx.meta, ctx.tier1, args.name)
    try:
        sealed = writer.seal()
    finally:
        writer.close()
    print(f"sealed ledger {sealed.ledger_id} ({sealed.entry_count} entries)" if sealed else "no open ledger")
    return 0


def ledger_status(ctx: Context, name: str) -> list[dict]:
    from tiering.model import LedgerState

    rows = []
    for led in ctx.meta.list_ledgers(name):
        entries, size = led.entry_count, led.size_bytes
        if led.state == LedgerState.OPEN:  # metadata learns counts at seal: the tier-1 file knows them now
            try:
                with ctx.tier1.reader(name, led.ledger_id) as r:
                    entries, size = r.entry_count, r.size_bytes
            except LedgerStorageError:
                pass  # no file yet
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


def tier2_opener(ctx: Context):
    """A ReadHandle's tier-2 opener that builds the S3 client on first use (a read that stays in tier 1 never
    pays for it), then shares one cache and pool across ledgers."""
    opener = None

    def open_ledger(led, chunk):
        nonlocal opener
        if opener is None:
            from tiering.tier2.reader import tier2_opener as make

            opener = make(ctx.bucket)
        return opener(led, chunk)

    return open_ledger


def read_handle(ctx: Context, raise_on_dataloss: bool = False, opener=None):
    from tiering.read import ReadHandle

    return ReadHandle(ctx.meta, ctx.tier1, open_tier2=opener or tier2_opener(ctx),
                      raise_on_dataloss=raise_on_dataloss)


def gap_dict(gap) -> dict:
    return {"gap": gap.kind, "from": str(gap.start), "to": str(gap.end)}


def cmd_read(ctx: Context, args) -> int:
    from tiering.read import Gap

    out = sys.stdout
    for item in read_handle(ctx, args.fail_on_dataloss).read(args.name, args.start, args.end):
        if isinstance(item, Gap):
            print_json(gap_dict(item))
        elif args.json:
            print_json({"ledger": item.ledger_id, "entry": item.entry_id, "data": b64(item.data)})
        else:
            out.write(f"{item.ledger_id}:{item.entry_id}\t{_printable(item.data)}\n")
    return 0


def _printable(data: bytes) -> str:
    """One line per entry: backslash escapes for the backslash, control characters and invalid UTF-8."""
    out = []
    for c in data.decode("utf-8", "surrogateescape"):
        if "\udc80" <= c <= "\udcff":  # a byte that is not UTF-8
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        elif c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def cmd_offload_status(ctx: Context, args) -> int:
    ledgers = ctx.meta.list_ledgers(args.name)
    chunks = ctx.meta.chunks(args.name)
    rows = []
    for led in ledgers:
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


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(desc: str, total: int | None, unit: str = "it", stream=None):
    """A tqdm bar on stderr when it is a terminal; an object that ignores updates otherwise."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return NoBar()
    from tqdm import tqdm

    scale = unit == "B"
    return tqdm(total=total, desc=desc, file=stream, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                leave=False)


def _progress(iterable, desc: str, stream, unit: str = "it"):
    """tqdm progress over an iterable when attached to a terminal; the bare iterable otherwise."""
    if not stream.isatty():
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, desc=desc, file=stream, unit=unit, leave=False)


HANDLERS = {"db": cmd_db, "topic": cmd_topic, "produce": cmd_produce, "seal": cmd_seal, "status": cmd_status,
            "read": cmd_read, "offload-status": cmd_offload_status}
