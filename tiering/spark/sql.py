"""Ad-hoc SQL over topics and the metadata tables together, with spark-submit:

    spark-submit --jars /usr/share/java/postgresql.jar \\
        --conf spark.driver.extraClassPath=/usr/share/java/postgresql.jar \\
        tiering/spark/sql.py "SELECT hour(sealed_at) h, count(*) FROM entries WHERE topic = 'orders' GROUP BY h"

Views: `entries` (the `tiering` source over every topic, or over --topics; filters on ledger_id, entry_id,
sealed_at and offloaded_at are pushed through the view) and, over JDBC, `topic`, `ledger`, `chunk` and
`job_run` (the `tiering` schema; Spark redacts the JDBC password from plans). Settings come from the
environment, as for every job. Prints the result as JSON lines (binary columns as hex), at most --limit rows.
"""
from __future__ import annotations

import argparse
import json
import sys

TABLES = ("topic", "ledger", "chunk", "job_run")


def jdbc_url(database_url: str) -> tuple[str, str, str]:
    """(jdbc url, user, password) of the metadata database."""
    from sqlalchemy.engine import make_url

    from urllib.parse import urlencode

    from tiering.database_url import database_libpq_params

    url = make_url(database_url)
    # libpq's TLS parameters carry over (pgjdbc knows sslmode/sslrootcert/sslcert/sslkey): without them pgjdbc's
    # default sslmode=prefer would connect without checking the server's certificate; so does `options`
    ssl = urlencode(database_libpq_params(database_url))
    # libpq also takes the user and password as query parameters (`?password=...`); pgjdbc is given them apart
    user, password = url.username or _last(url.query.get("user")), url.password or _last(url.query.get("password"))
    return (f"jdbc:postgresql://{url.host or 'localhost'}:{url.port or 5432}/{url.database}" + (f"?{ssl}" if ssl else ""),
            user or "", password or "")


def _last(value) -> str | None:
    """A query parameter's value as libpq takes it: the last one given."""
    return value[-1] if isinstance(value, tuple) else value


def views(spark, settings, topics: str | None = None, jdbc: bool = True) -> None:
    """Register the `entries` view (and the metadata tables over JDBC) on `spark`."""
    from tiering.spark import register

    register(spark, settings)
    reader = spark.read.format("tiering")
    reader = reader.option("topics", topics) if topics else reader.option("topicRegex", ".*")
    reader.load().createOrReplaceTempView("entries")
    if not jdbc:
        return
    url, user, password = jdbc_url(settings.database_url)
    for table in TABLES:
        (spark.read.format("jdbc").option("url", url).option("user", user).option("password", password)
         .option("driver", "org.postgresql.Driver").option("dbtable", f"tiering.{table}").load()
         .createOrReplaceTempView(table))


def _plain(value):
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    return value


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tiering-sql")
    p.add_argument("query")
    p.add_argument("--topics", help="comma list of topics behind the `entries` view (default: every topic)")
    p.add_argument("--limit", type=int, default=1000)
    p.add_argument("--no-jdbc", action="store_true", help="only the `entries` view (no metadata tables)")
    args = p.parse_args(argv)

    from pyspark.sql import SparkSession

    from tiering.config import Settings
    from tiering.errors import TieringError

    try:
        settings = Settings.from_env()
    except TieringError as exc:
        print(f"tiering-sql: error: {exc}", file=sys.stderr)
        return 2
    spark = SparkSession.builder.appName("tiering-sql").config("spark.sql.session.timeZone", "UTC").getOrCreate()
    views(spark, settings, args.topics, jdbc=not args.no_jdbc)
    for row in spark.sql(args.query).limit(args.limit).toLocalIterator():
        print(json.dumps({k: _plain(v) for k, v in row.asDict().items()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
