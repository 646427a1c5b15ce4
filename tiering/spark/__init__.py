"""Spark reads topics across both tiers: the `tiering` data source (`tiering.spark.source`).

    from tiering.spark import register
    register(spark)                       # settings from the environment (TIERING_*, AWS_*)
    spark.read.format("tiering").option("topic", "orders").load()
"""
from __future__ import annotations

PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"


def register(spark, settings=None):
    """Register the `tiering` source on this session, bound to `settings` (default: Settings.from_env() on
    the driver). The settings travel inside the registered class (pickled, like a job's closure), never as
    options, so no secret shows in a plan or a log. Also turns on Python filter pushdown, which the source
    needs (Spark refuses a reader with pushFilters while it is off)."""
    from tiering.config import Settings
    from tiering.spark.source import TieringDataSource

    bound = settings if settings is not None else Settings.from_env()
    # A class made here is pickled by value (it is not importable by name), carrying its settings along, and
    # the session's parallelism, by which a scan packs its partitions (option packBytes, source.py).
    cls = type("TieringDataSource", (TieringDataSource,), {"_settings": bound, "_parallelism": _parallelism(spark)})
    spark.conf.set(PUSHDOWN_CONF, "true")
    spark.dataSource.register(cls)
    return cls


def _parallelism(spark) -> int | None:
    """The session's default parallelism (its cores), or None where the session has no SparkContext (Spark
    Connect): then the source does not pack by it."""
    try:
        return int(spark.sparkContext.defaultParallelism)
    except Exception:  # noqa: BLE001 - Spark Connect refuses sparkContext with its own error types
        return None


__all__ = ["register", "PUSHDOWN_CONF"]
