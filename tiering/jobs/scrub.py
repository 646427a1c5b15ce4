"""Spark job: scrub every topic (or one) through the `tiering` data source: every entry of every ledger is
read from the tier that holds it, every tier-2 page's CRC32C and every tier-1 payload's CRC checked, and
the result recorded in one `job_run` row (kind `scrub`).

One query reads all topics in parallel (a partition per ledger or run of pages), in the source's PERMISSIVE
mode: a finding (a corrupt page names its object, page and offset; a corrupt tier-1 copy its file; DATALOSS
the ledger) ends its partition in a row saying it, so the run names every broken ledger from one query and
Spark does not retry what would fail again. DATALOSS is never skipped here: a scrub that skipped it would
report loss as success. When the query itself fails (an outage outlasting Spark's retries), each topic is
scrubbed alone, so the row still says which topics are sound.

Then the repair's check (tiering/ops/repair.py) looks at what the scrub did not read from tier 2: every
offloaded ledger of a topic that failed, and the tier-2 copies of ledgers read from their tier-1 copy
(offloaded, within their deletion lag: the only copies still repairable, and what a healthy run checks: no
listing of the bucket, nothing when no such copy exists). It says which broken tier-2 copies are repairable
from a verified tier-1 copy and which are not; with `--repair` (the DAG's `repair` Param) they are repaired
and ledgers with no good copy marked lost (a lost ledger whose good copy is back is recovered). The counts go
to the row's details (`repairable`, `unrepairable`, `repaired`, `lost`, `recovered`), which the dashboard
shows; the topics' scrub errors stay: the run found them.
"""
from __future__ import annotations

import argparse
import sys

from tiering import clients

APP = "tiering-scrub"


def _first_line(exc: BaseException) -> str:
    """The Python error inside a Spark failure (the line naming object, page and offset), else the first."""
    text = str(exc)
    for line in text.splitlines():
        if "Error:" in line and ("tiering" in line or "DATALOSS" in line or "corrupt" in line):
            return line.strip()[:1000]
    return (text.splitlines() or [type(exc).__name__])[0][:1000]


def scrub(spark, topics: list[str]) -> tuple[dict[str, dict], dict[str, str], int]:
    """({topic: {entries, bytes, ledgers, findings}}, {topic or "*": error}, Spark queries run) of reading
    every entry of `topics`: a topic with findings is in both, its error the first finding (in ledger order)
    and how many more."""
    from pyspark.sql import functions as F

    def query(names: list[str] | None) -> dict:
        # one topic by name; all of them by a regex matching every name (a name may hold a comma)
        src = spark.read.format("tiering").option("strictTier1", "true").option("mode", "PERMISSIVE")
        df = (src.option("topic", names[0]) if names else src.option("topicRegex", ".*")).load()
        ok = F.col("error").isNull()
        finding = F.format_string("ledger %d from entry %d: %s", "ledger_id", "entry_id", "error")
        return {r.topic: r for r in df.groupBy("topic").agg(
            F.count(F.when(ok, 1)).alias("entries"), F.sum(F.when(ok, F.length("payload"))).alias("bytes"),
            F.countDistinct(F.when(ok, F.col("ledger_id"))).alias("ledgers"), F.count("error").alias("findings"),
            # min_by skips rows whose ordering is null: the entry rows here
            F.min_by(finding, F.when(~ok, F.struct("ledger_id", "entry_id"))).alias("first")).collect()}

    def record(t: str, r, results: dict, errors: dict) -> None:
        if r is None:  # no row of the topic: nothing in it to read
            results[t] = {"entries": 0, "bytes": 0, "ledgers": 0, "findings": 0}
            return
        results[t] = {"entries": r.entries, "bytes": int(r.bytes or 0), "ledgers": r.ledgers, "findings": r.findings}
        if r.findings:
            errors[t] = r.first + (f" (and {r.findings - 1} more)" if r.findings > 1 else "")

    results, errors = {}, {}
    if not topics:
        return results, errors, 0
    try:
        got = query(topics if len(topics) == 1 else None)
    except Exception as exc:  # noqa: BLE001 - narrowed down per topic below
        whole = _first_line(exc)
    else:
        for t in topics:
            record(t, got.get(t), results, errors)
        return results, errors, 1
    for t in topics:
        try:
            record(t, query([t]).get(t), results, errors)
        except Exception as exc:  # noqa: BLE001 - recorded in job_run
            errors[t] = _first_line(exc)
    if not errors:  # the whole query failed yet each topic alone read: say so rather than succeed silently
        errors["*"] = whole
    return results, errors, 1 + len(topics)


def repair_broken(settings, topics: list[str], failed: set[str], do_repair: bool, errors: list[str]) -> dict:
    """The repair's counts over `topics` (checked only, or repaired with `do_repair`): every offloaded
    ledger of the `failed` ones, the others' ledgers with a tier-1 copy (whose tier-2 copy the scrub did not
    read). Its failures and lost ledgers are appended to `errors`."""
    counts = {"repairable": 0, "unrepairable": 0, "repaired": 0, "lost": 0, "recovered": 0, "repair": do_repair}
    from tiering.jobs.runner import deps_from
    from tiering.ops.repair import repair

    deps = deps_from(settings)
    try:
        for t in topics:
            try:
                # a failed topic's tier-1 copies are checked too: the read may have failed on one of them
                report = repair(deps, t, dry_run=not do_repair, tier1_copies=t in failed,
                                keep=None if t in failed else (lambda led: led.tier1_present))
            except Exception as exc:  # noqa: BLE001 - recorded in job_run; the other topics go on
                errors.append(f"{t}: repair: {type(exc).__name__}: {str(exc)[:500]}")
                continue
            repairable = sum(1 for f in report.findings if f.repairable)
            counts["repairable"] += repairable
            counts["unrepairable"] += len(report.findings) - repairable
            counts["repaired"] += len(report.repaired)
            counts["lost"] += len(report.lost)
            counts["recovered"] += len(report.recovered)  # with do_repair cleared, else would be
            if not do_repair:  # found, not repaired: the run says so (a repaired copy is no error)
                errors.extend(f"{t}: ledger {f.led.ledger_id}: {'' if f.drop_tier1 else 'tier-2 copy: '}{f.problem} "
                              f"({'repairable' if f.repairable else 'not repairable'})" for f in report.findings)
                errors.extend(f"{t}: ledger {i} is marked lost and its good copy is back (recoverable)"
                              for _, i in report.recovered)
            errors.extend(f"{t}: repair: ledger {f['ledger']}: {f['error']}" for f in report.failed)
            errors.extend(f"{t}: ledger {i} is lost: no tier holds a good copy" for _, i in report.lost)
    finally:
        deps.meta.engine.dispose()
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tiering-scrub")
    p.add_argument("--topic", help="scrub one topic (default: every topic)")
    p.add_argument("--repair", action="store_true", help="repair the topics found broken (tiering repair)")
    args = p.parse_args(argv)

    from tiering.jobs.runner import load_settings, recorded, run_ref, spark_session
    from tiering.metadata.repository import MetadataStore

    settings = load_settings("scrub")
    if settings is None:
        return 2
    engine = clients.engine(settings, pool_size=1)

    def body(outcome, _run_id: int) -> None:
        try:
            topics = [args.topic] if args.topic else [t.name for t in MetadataStore(engine).list_topics()]
            outcome.details["planned"] = len(topics)
            if not topics:
                outcome.details["spark"] = "skipped"
                return
            from tiering.spark import register

            spark = spark_session(APP, outcome)
            register(spark, settings)
            results, errors, queries = scrub(spark, topics)
            sound = [r for t, r in results.items() if t not in errors]  # topics read whole
            outcome.items_done = len(sound)
            outcome.items_failed = len(errors) - (1 if "*" in errors else 0)
            outcome.bytes = sum(r["bytes"] for r in sound)
            outcome.details.update(entries=sum(r["entries"] for r in sound),
                                   ledgers=sum(r["ledgers"] for r in sound),
                                   findings=sum(r["findings"] for r in results.values()), queries=queries,
                                   failed_topics=sorted(t for t in errors if t != "*"))
            outcome.errors.extend(f"{t}: {e}" for t, e in errors.items())
            outcome.details.update(repair_broken(settings, topics, set(errors), args.repair, outcome.errors))
        except Exception as exc:  # noqa: BLE001 - a Spark failure's useful line, not its JVM trace
            outcome.errors.append(f"{type(exc).__name__}: {_first_line(exc)}")

    try:
        return recorded("scrub", run_ref("scrub"), args.topic, engine, body)
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
