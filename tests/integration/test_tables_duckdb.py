"""Another engine reads a topic's Iceberg table: DuckDB's Iceberg extension (C++, sharing no code with
pyiceberg, which writes the tables) scans it from the metadata file `tiering table status` names, on the
run's RGW, and finds exactly the entries `tiering read` gives, each once: after a sync of ledgers read from
both tiers, a sync with nothing new, a decoder that gained a field, a truncate under retention `follow`, and
maintenance (compaction, snapshot expiry, orphan deletion). The dead-letter table too."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import duckdb
import pytest
from sqlalchemy import text

from tests.integration.helpers import produce
from tests.integration.test_tables_cli import _read, cli  # noqa: F401 - the fixture
from tiering.ops.offload import offload_ledger

ROOT = Path(__file__).resolve().parents[2]


def duck(settings):
    """A DuckDB connection reading tier 2's bucket, as docs/tables.md tells a user to open one: the Iceberg
    and httpfs extensions from their PyPI packages (nothing is downloaded at run time), the S3 keys in a
    secret, never in a query's text; no cache of remote files, so each scan reads the bucket as it is now."""
    import duckdb_ext

    extensions = os.path.join(list(duckdb_ext.__path__)[0], "extensions")
    con = duckdb.connect(config={"extension_directory": extensions, "autoinstall_known_extensions": False,
                                 "enable_external_file_cache": False})
    con.execute("LOAD iceberg")
    con.execute("LOAD httpfs")
    endpoint = urlsplit(settings.s3_endpoint_url)
    con.execute("CREATE SECRET tier2 (TYPE s3, KEY_ID ?, SECRET ?, REGION ?, ENDPOINT ?, URL_STYLE 'path', "
                "USE_SSL ?)", [settings.aws_access_key_id, settings.aws_secret_access_key, settings.aws_region,
                               endpoint.netloc, endpoint.scheme == "https"])
    return con


def scan(con, location: str, columns: str = "ledger_id, entry_id, payload") -> list[tuple]:
    assert "'" not in location
    return con.execute(f"SELECT {columns} FROM iceberg_scan('{location}') ORDER BY ledger_id, entry_id").fetchall()


def location(cli, topic: str) -> str:
    return cli("table", "status", topic, "--json").ok().json["metadata_location"]


def catalog_location(db, identifier: str) -> str:
    """What a user finds with SQL in the metadata database: the catalog row pyiceberg's SQL catalog keeps."""
    namespace, name = identifier.split(".")
    with db.connect() as conn:
        return conn.execute(text("SELECT metadata_location FROM iceberg_tables WHERE catalog_name = 'tiering' "
                                 "AND table_namespace = :n AND table_name = :t"), {"n": namespace, "t": name}).scalar_one()


def docs_snippet() -> str:
    """The Python block of docs/tables.md's "Reading a table from another engine"."""
    section = (ROOT / "docs" / "tables.md").read_text().split("## Reading a table from another engine", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def as_rows(read: dict) -> list[tuple]:
    return [(ledger, entry, data) for (ledger, entry), data in sorted(read.items())]


def test_duckdb_reads_the_table_exactly_as_tiering_read_gives_the_topic(cli, deps, settings, db):
    docs = [json.dumps({"id": i, "name": f"n{i}"}).encode() for i in range(300)]
    produce(deps, "orders", [docs[:200], docs[200:] + [b"not json"]])
    cli("topic", "set", "orders", "--table", "sales.orders", "--table-json-fields", "id:int64,name:string").ok()
    offload_ledger(deps, deps.meta.list_ledgers("orders")[0])  # one ledger from tier 2, one from tier 1
    assert cli("table", "sync", "--topic", "orders", "--json").ok().json["ledger_count"] == 2
    con = duck(settings)
    first = location(cli, "orders")
    assert first == catalog_location(db, "sales.orders")

    rows = scan(con, first)
    assert rows == as_rows(_read(deps, "orders")) and len(rows) == 301
    decoded = scan(con, first, "ledger_id, entry_id, id, name")
    assert [(r[2], r[3]) for r in decoded[:300]] == [(i, f"n{i}") for i in range(300)]
    assert decoded[300][2:] == (None, None)  # the line that is not JSON: null fields, and in the DLQ table
    dlq = scan(con, catalog_location(db, "sales.orders__dlq"), "ledger_id, entry_id, payload, reason")
    assert [r[:3] for r in dlq] == [(1, 100, b"not json")] and dlq[0][3]
    assert con.execute(f"SELECT DISTINCT topic FROM iceberg_scan('{first}')").fetchall() == [("orders",)]

    # a sync with nothing new commits nothing: the same snapshot, the same rows
    assert cli("table", "sync", "--topic", "orders", "--json").ok().json["ledger_count"] == 0
    assert location(cli, "orders") == first

    # the decoder gains a field: the older files, which lack it, read it as null
    cli("topic", "set", "orders", "--table-json-fields", "id:int64,name:string,score:double").ok()
    cli("produce", "orders", "--stdin-lines", "--seal", stdin=b'{"id": 7, "name": "x", "score": 2.5}\n').ok()
    assert cli("table", "sync", "--topic", "orders", "--json").ok().json["ledger_count"] == 1
    second = location(cli, "orders")
    assert scan(con, second) == as_rows(_read(deps, "orders"))
    scores = scan(con, second, "ledger_id, entry_id, score")
    assert scores[-1] == (2, 0, 2.5) and {s for _, _, s in scores[:-1]} == {None}

    # truncate under retention `follow`: the next sync deletes the ledger's rows; another engine sees them go
    cli("truncate", "orders", "1:0").ok()
    cli("table", "sync", "--topic", "orders").ok()
    rows = scan(con, location(cli, "orders"))
    assert rows == as_rows(_read(deps, "orders")) and {r[0] for r in rows} == {1, 2}

    # maintenance compacts, expires every older snapshot and deletes the files nothing references: the
    # current metadata reads the same rows; the first metadata no longer reads (what it names was deleted)
    cli("table", "maintain", "--topic", "orders", "--expire-after-seconds", "0", "--orphan-grace-seconds", "0").ok()
    fourth = location(cli, "orders")
    assert scan(con, fourth) == as_rows(_read(deps, "orders"))
    assert cli("table", "verify", "orders", "--json").ok().json["failed"] == []
    with pytest.raises(duckdb.Error):
        scan(con, first)

    # what docs/tables.md tells a user to run, as it stands there
    env = {**cli.env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{cli.env.get('PATH', '')}"}
    ran = subprocess.run([sys.executable, "-c", docs_snippet()], env=env, cwd=cli.cwd, capture_output=True,
                         text=True, timeout=120)
    assert ran.returncode == 0, ran.stderr
    counts = re.findall(r"│\s*(\d+)\s*│\s*(\d+)\s*│", ran.stdout)
    assert counts == [("1", "101"), ("2", "1")], ran.stdout
