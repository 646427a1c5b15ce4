"""Spark job: scrub every topic (or one) through the `tiering` data source: every entry of every ledger is
read from the tier that holds it, every tier-2 page's CRC32C and every tier-1 payload's CRC checked, and
the result recorded in one `job_run` row (kind `scrub`).

One query reads all topics in parallel (a partition per ledger or run of pages). When it fails (a corrupt
page names its object, page and offset; DATALOSS names the ledger), each topic is then scrubbed alone so
the row says which topics are sound and which are not: a healthy run costs one query, a broken one a query
per topic. DATALOSS is never skipped here: a scrub that skipped it would report loss as success.

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


def scrub(spark, topics: list[str]) -> tuple[dict[str, dict], dict[str, str]]:
    """({topic: {entries, bytes, ledgers}}, {topic or "*": error}) of reading every entry of `topics`."""
    from pyspark.sql import functions as F

    def query(names: list[str] | None):
        # one topic by name; all of them by a regex matching every name (a name may hold a comma)
        src = spark.read.format("tiering").option("strictTier1", "true")  # a corrupt tier-1 copy is a finding
        df = (src.option("topic", names[0]) if names else src.option("topicRegex", ".*")).load()
        return {r.topic: {"entries": r.entries, "bytes": int(r.bytes or 0), "ledgers": r.ledgers}
                for r in df.groupBy("topic").agg(F.count("*").alias("entries"),
                                                 F.sum(F.length("payload")).alias("bytes"),
                                                 F.countDistinct("ledger_id").alias("ledgers")).collect()}

    if not topics:
        return {}, {}
    try:
        got = query(topics if len(topics) == 1 else None)
        return {t: got.get(t, {"entries": 0, "bytes": 0, "ledgers": 0}) for t in topics}, {}
    except Exception as exc:  # noqa: BLE001 - narrowed down per topic below
        whole = _first_line(exc)
    results, errors = {}, {}
    for t in topics:
        try:
            results[t] = query([t]).get(t, {"entries": 0, "bytes": 0, "ledgers": 0})
        except Exception as exc:  # noqa: BLE001 - recorded in job_run
            errors[t] = _first_line(exc)
    if not errors:  # the whole query failed yet each topic alone read: say so rather than succeed silently
        errors["*"] = whole
    return results, errors


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
            results, errors = scrub(spark, topics)
            outcome.items_done = len(results)
            outcome.items_failed = len(errors) - (1 if "*" in errors else 0)
            outcome.bytes = sum(r["bytes"] for r in results.values())
            outcome.details.update(entries=sum(r["entries"] for r in results.values()),
                                   ledgers=sum(r["ledgers"] for r in results.values()),
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
