"""export-metadata, import-metadata and recover-from-bucket through the real command."""
from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from tests.integration.helpers import entries, make_deps, produce
from tests.integration.test_cli import cli, read_data  # noqa: F401 - the fixture
from tiering.metadata import make_engine, upgrade
from tiering.model import LedgerState as S, TopicPolicy
from tiering.ops.offload import offload_many


@pytest.fixture
def other_database(database_url):
    server = make_url(database_url)
    name = server.database + "_cli"
    admin = create_engine(server.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    upgrade(engine)
    engine.dispose()
    yield url
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    admin.dispose()


def test_export_import_and_recover_by_hand(cli, db, s3_client, bucket, tier1_root, tmp_path, other_database):
    deps = make_deps(db, s3_client, bucket, tier1_root)
    produce(deps, "m", [entries("m0", 5, 100), entries("m1", 5, 100)], TopicPolicy(rollover_entries=10**6))
    offload_many(deps, deps.meta.list_ledgers("m", [S.SEALED]))
    before = read_data(cli("read", "m", "--json"))

    dest = str(tmp_path / "snap")
    out = cli("export-metadata", dest, "--json").ok().json_lines[0]
    assert out["row_counts"]["ledger"] == 2 and out["row_counts"]["chunk"] == 2
    assert "already" in cli("export-metadata", dest).one_line_error(2)  # no silent overwrite
    refused = cli("export-metadata", f"s3://{bucket}/t/snap").one_line_error(2)
    assert "GC" in refused
    for command in ("export-metadata", "import-metadata"):  # was exit 1, the server's code for the export
        assert "bucket 'no-such-bucket-of-tiering' does not exist" in \
            cli(command, "s3://no-such-bucket-of-tiering/snap").one_line_error(2)

    elsewhere = {"TIERING_DATABASE_URL": other_database}
    # an export names its store's bucket: under another, every chunk row would name objects not there
    refused = cli("import-metadata", dest, env={**elsewhere, "TIERING_BUCKET": "another-bucket"}).one_line_error(2)
    assert f"bucket {bucket!r}, not 'another-bucket'" in refused and "--other-bucket" in refused
    with create_engine(other_database.replace("postgresql://", "postgresql+psycopg2://", 1)).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM tiering.ledger")).scalar_one() == 0
    cli("import-metadata", dest, env=elsewhere).ok()
    assert read_data(cli("read", "m", "--json", env=elsewhere)) == before
    assert "rows" in cli("import-metadata", dest, env=elsewhere).one_line_error(2)  # not empty any more
    with create_engine(other_database.replace("postgresql://", "postgresql+psycopg2://", 1)).begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                          "tiering.attribute, tiering.job_run CASCADE"))
    # the objects copied to another bucket under the same keys: the operator says so; that bucket must exist
    copy = f"{bucket}-copy"
    refused = cli("import-metadata", dest, "--other-bucket", env={**elsewhere, "TIERING_BUCKET": copy})
    assert f"bucket {copy!r} does not exist" in refused.one_line_error(1)
    s3_client.create_bucket(Bucket=copy)
    try:
        cli("import-metadata", dest, "--other-bucket", env={**elsewhere, "TIERING_BUCKET": copy}).ok()
    finally:
        s3_client.delete_bucket(Bucket=copy)

    with create_engine(other_database.replace("postgresql://", "postgresql+psycopg2://", 1)).begin() as conn:
        conn.execute(text("TRUNCATE tiering.topic, tiering.ledger, tiering.chunk, tiering.gc_task, "
                          "tiering.attribute, tiering.job_run CASCADE"))
    rec = cli("recover-from-bucket", "--json", env=elsewhere).ok().json_lines[0]
    assert rec["ledgers_recovered_count"] == 2 and rec["topics_created"] == ["m"]
    assert "subscriptions" in rec["not_recovered"] and "topic set" in rec["not_recovered"]  # says what it cannot know
    assert "--table NS.NAME" in rec["not_recovered"]
    # tier 1 still holds the copies; remove them from this view so reads come from tier 2 only
    assert read_data(cli("read", "m", "--json", env={**elsewhere, "TIERING_TIER1_ROOT": str(tmp_path / "none")})) \
        == before
    assert cli("recover-from-bucket", "--json", env=elsewhere).ok().json_lines[0]["ledgers_recovered_count"] == 0
