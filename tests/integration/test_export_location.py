"""An export location holds one export that cannot lie, for the library export and the
Spark job (in this process, local[2], real PostgreSQL over JDBC, RGW): a complete export is refused or
replaced with its manifest deleted first; a part of another export passes no check; a failed export leaves
neither a manifest nor parts; an executor that does not see a local destination writes nothing."""
from __future__ import annotations

import contextlib
import os
import threading

import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli  # noqa: F401 - the fixture
from tiering.errors import BadInput, TieringError
from tiering.model import TopicPolicy
from tiering.ops import export_location as loc
from tiering.ops import export_metadata as ex

JDBC_JAR = "/usr/share/java/postgresql.jar"


def _files(fs, base) -> list[str]:
    infos = fs.get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
    return sorted(i.path[len(base):].lstrip("/") for i in infos if i.type == pafs.FileType.File)


@pytest.fixture
def world(deps):
    produce(deps, "x", [entries("x", 3, 100) for _ in range(2)], TopicPolicy(rollover_entries=10**9,
                                                                             rollover_bytes=2**40))
    return deps


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path, settings):
    if request.param == "local":
        return ex.filesystem_for(str(tmp_path / "exp"))
    return ex.filesystem_for(f"s3://{settings.bucket}/exports/e1", settings)


def test_a_complete_export_is_refused_then_replaced_manifest_first(world, db, where):
    fs, base = where
    first = ex.export_metadata(db, fs, base)
    with pytest.raises(BadInput, match="already holds a complete export"):
        ex.export_metadata(db, fs, base)
    assert ex.read_manifest(fs, base).export_id == first.export_id  # refused: untouched
    world.meta.create_topic("y")
    second = ex.export_metadata(db, fs, base, overwrite=True)
    assert second.export_id != first.export_id and ex.read_manifest(fs, base).row_counts["topic"] == 2
    files = _files(fs, base)
    assert files == sorted(["manifest.json"] + [p.path for t in second.tables.values() for p in t.files])
    assert not any(first.export_id in f for f in files)  # the old parts went


def test_a_part_of_another_export_passes_no_check(world, db, tmp_path):
    fs, base = ex.filesystem_for(str(tmp_path / "exp"))
    done = ex.export_metadata(db, fs, base)
    # an older part at the same path, with the same row count, but written by another export
    part = done.tables["topic"].files[0]
    stale = ex.arrow_schema("topic", "someone-else").empty_table()
    import pyarrow as pa

    rows = pq.read_table(f"{base}/{part.path}").cast(ex.arrow_schema("topic", "someone-else"))
    pq.write_table(pa.concat_tables([stale, rows]), f"{base}/{part.path}")
    with pytest.raises(TieringError, match="belongs to export someone-else"):
        ex.check_parts(fs, base, done)


def test_a_failed_export_leaves_no_manifest_and_no_parts(world, db, where, monkeypatch):
    fs, base = where
    ex.export_metadata(db, fs, base)
    real = ex._PartWriter.write
    calls = []

    def failing(self, data):
        calls.append(1)
        if len(calls) == 2:  # the second table with rows (ledger, after topic)
            raise OSError("disk went away")
        return real(self, data)

    monkeypatch.setattr(ex._PartWriter, "write", failing)
    with pytest.raises(OSError):
        ex.export_metadata(db, fs, base, overwrite=True)
    assert _files(fs, base) == []  # the old manifest went first, the new parts after the failure


def test_leftovers_of_a_killed_export_are_removed_by_the_next(world, db, tmp_path):
    fs, base = ex.filesystem_for(str(tmp_path / "exp"))
    loc.claim(fs, base, "dead", overwrite=False)
    ex.write_part(fs, base, "ledger", 0, ex.arrow_schema("ledger").empty_table(), "dead")
    done = ex.export_metadata(db, fs, base)
    assert not any("dead" in f for f in _files(fs, base)) and ex.read_manifest(fs, base).export_id == done.export_id


def test_an_executor_without_the_drivers_marker_writes_nothing(tmp_path):
    fs, base = ex.filesystem_for(str(tmp_path / "exp"))
    with pytest.raises(loc.ExportNotShared, match="on node-2 is not the driver's"):
        loc.check_shared(fs, base, "e9", "node-2")
    loc.claim(fs, base, "e9", overwrite=False)
    loc.check_shared(fs, base, "e9", "node-1")  # the driver's own disk: fine


def _put(fs, path: str, data: bytes) -> None:
    if loc.is_local(fs):
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with fs.open_output_stream(path) as out:
        out.write(data)


def test_files_that_are_not_an_exports_are_refused_and_kept(world, db, where):
    fs, base = where
    _put(fs, f"{base}/topic/notes.txt", b"mine")
    _put(fs, f"{base}/ledger/part-00000.parquet", b"not parquet")  # our name, not our file
    _put(fs, f"{base}/notes.txt", b"beside, not in a table directory")
    before = _files(fs, base)
    with pytest.raises(BadInput, match="is not an export location: .*topic/notes.txt and 1 more"):
        ex.export_metadata(db, fs, base)
    assert _files(fs, base) == before  # nothing removed, nothing written
    fs.delete_file(f"{base}/topic/notes.txt")
    fs.delete_file(f"{base}/ledger/part-00000.parquet")
    done = ex.export_metadata(db, fs, base)
    _put(fs, f"{base}/chunk/notes.txt", b"mine")  # into a complete export: refused even with overwrite
    with pytest.raises(BadInput, match="chunk/notes.txt is not a part"):
        ex.export_metadata(db, fs, base, overwrite=True)
    assert ex.read_manifest(fs, base).export_id == done.export_id and "chunk/notes.txt" in _files(fs, base)


def test_the_bucket_root_with_folders_named_like_tables_is_refused(world, db, settings, s3_client):
    s3_client.put_object(Bucket=settings.bucket, Key="topic/notes.txt", Body=b"mine")
    try:
        fs, base = ex.filesystem_for(f"s3://{settings.bucket}/", settings)
        with pytest.raises(BadInput, match="is not an export location"):
            ex.export_metadata(db, fs, base)
        assert s3_client.get_object(Bucket=settings.bucket, Key="topic/notes.txt")["Body"].read() == b"mine"
        assert "Contents" not in s3_client.list_objects_v2(Bucket=settings.bucket, Prefix="manifest.json")
    finally:
        s3_client.delete_object(Bucket=settings.bucket, Key="topic/notes.txt")


def test_the_command_refuses_a_directory_with_its_own_files(cli, tmp_path):
    home = tmp_path / "home"
    (home / "topic").mkdir(parents=True)
    (home / "topic" / "notes.txt").write_text("hi")
    assert "is not an export location" in cli("export-metadata", str(home)).one_line_error(2)
    assert (home / "topic" / "notes.txt").read_text() == "hi" and sorted(p.name for p in home.iterdir()) == ["topic"]


def test_the_command_refuses_the_iceberg_tables_prefix(cli, settings, s3_client):
    # table maintenance's orphan sweep would delete an export inside a table's directory as files no
    # snapshot names; the command names the prefix and writes nothing
    tables = f"{settings.prefix.rstrip('/')}-tables"
    dest = f"s3://{settings.bucket}/{tables}/ns/t1/backup"
    assert f"under the Iceberg tables' prefix '{tables}/'" in cli("export-metadata", dest).one_line_error(2)
    assert s3_client.list_objects_v2(Bucket=settings.bucket, Prefix=f"{tables}/").get("KeyCount") == 0


@pytest.mark.parametrize("spelling", ["plain", "file_url"])
def test_a_local_location_that_cannot_be_a_directory_is_bad_input(cli, tmp_path, spelling):
    # pyarrow's FileExistsError / ENAMETOOLONG came out as exit 1, as if a service had failed
    here = tmp_path / "here"
    here.mkdir()
    afile, fifo = here / "afile", here / "fifo"
    afile.write_text("mine")
    os.mkfifo(fifo)
    for path, why in ((afile, "is not a directory"), (fifo, "is not a directory"),
                      (afile / "sub", "(a part of it) is not a directory"), (here / ("a" * 300), "File name too long")):
        dest = path.as_uri() if spelling == "file_url" else str(path)
        for command in ("export-metadata", "import-metadata"):
            assert why in cli(command, dest).one_line_error(2)
    assert afile.read_text() == "mine" and sorted(p.name for p in here.iterdir()) == ["afile", "fifo"]


def test_a_killed_writers_part_without_a_footer_is_removed(world, db, tmp_path):
    fs, base = ex.filesystem_for(str(tmp_path / "exp"))
    loc.claim(fs, base, "dead", overwrite=False)
    _put(fs, f"{base}/ledger/part-dead-00001.parquet", b"PAR1 cut short")  # its marker says whose it is
    ex.export_metadata(db, fs, base)
    assert not any("dead" in f for f in _files(fs, base))


def test_a_second_export_into_a_location_being_written_stops_before_touching_it(world, db, where, monkeypatch):
    fs, base = where
    inside, go_on = threading.Event(), threading.Event()
    real_claim = ex.claim

    def claim(*a, **k):
        real_claim(*a, **k)
        inside.set()
        go_on.wait(60)  # the first export holds the location, its claim done, no manifest yet

    monkeypatch.setattr(ex, "claim", claim)
    results: list = []
    first = threading.Thread(target=lambda: results.append(ex.export_metadata(db, fs, base)))
    first.start()
    assert inside.wait(60)
    before = _files(fs, base)
    monkeypatch.setattr(ex, "claim", real_claim)
    with pytest.raises(loc.LocationTaken, match="another export is writing to .* now; nothing written"):
        ex.export_metadata(db, fs, base, overwrite=True)
    assert _files(fs, base) == before  # nothing read, removed or written
    go_on.set()
    first.join(120)
    [done] = results
    real_check = ex.check_parts
    real_check(fs, base, done)
    assert _files(fs, base) == sorted(["manifest.json"] + [p.path for t in done.tables.values() for p in t.files])


def test_one_local_location_spelt_another_way_is_the_same_locations_lock(world, db, tmp_path):
    """The lock is named after the location's path: a file:// URL of the directory another export holds,
    spelt with a doubled slash or a step back, is that directory and finds it held."""
    fs, base = ex.filesystem_for(str(tmp_path / "exp"))
    with loc.only_writer(db, fs, base):
        for other in (f"file://{tmp_path}//exp", f"file://{tmp_path}/x/../exp/", f"{tmp_path}//exp"):
            with pytest.raises(loc.LocationTaken, match="another export is writing"):
                ex.export_metadata(db, *ex.filesystem_for(other))
    assert _files(fs, base) == []


def test_two_exports_past_the_lock_at_once_one_wins(world, db, where, monkeypatch):
    """Exports of two databases into one location (no shared lock): the manifest decides."""
    fs, base = where
    monkeypatch.setattr(ex, "only_writer", lambda *a: contextlib.nullcontext())
    claimed, checked = threading.Barrier(2, timeout=60), threading.Barrier(2, timeout=60)
    real_claim, real_check = ex.claim, ex.check_parts

    def claim(*a, **k):
        real_claim(*a, **k)
        claimed.wait()  # both have claimed before either writes a part

    def check_parts(*a, **k):
        real_check(*a, **k)
        checked.wait()  # both have checked their parts: both go for the manifest at once

    monkeypatch.setattr(ex, "claim", claim)
    monkeypatch.setattr(ex, "check_parts", check_parts)
    results: list = [None, None]

    def run(i):
        try:
            results[i] = ex.export_metadata(db, fs, base)
        except Exception as exc:  # noqa: BLE001 - the loser's error is the result
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    won = [r for r in results if isinstance(r, ex.Manifest)]
    lost = [r for r in results if not isinstance(r, ex.Manifest)]
    assert len(won) == 1 and isinstance(lost[0], loc.LocationTaken), results
    assert "another export took" in str(lost[0])
    assert ex.read_manifest(fs, base).export_id == won[0].export_id
    real_check(fs, base, won[0])  # complete
    assert _files(fs, base) == sorted(["manifest.json"] + [p.path for t in won[0].tables.values() for p in t.files])


def test_a_part_removed_under_the_manifest_takes_the_manifest_away(world, db, where, monkeypatch):
    fs, base = where
    real_check = ex.check_parts

    def check_then_lose_a_part(fs_, base_, manifest):
        real_check(fs_, base_, manifest)  # passed; then another export's claim removes a part
        fs.delete_file(f"{base}/{manifest.tables['ledger'].files[0].path}")

    monkeypatch.setattr(ex, "check_parts", check_then_lose_a_part)
    with pytest.raises(loc.LocationTaken, match="removed part ledger/part-"):
        ex.export_metadata(db, fs, base)
    assert _files(fs, base) == []  # neither a manifest over a missing part nor the remaining parts


# ------------------------------------------------------------------------------------------- the Spark job
@pytest.fixture(scope="module")
def spark():
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("test-export-location")
               .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.jars", JDBC_JAR).config("spark.driver.extraClassPath", JDBC_JAR).getOrCreate())
    yield session
    session.stop()


def _job(settings, monkeypatch, *argv: str) -> int:
    from tiering.jobs import export_metadata as job

    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    return job.main(list(argv))


def test_the_spark_job_refuses_replaces_and_cleans_up(world, settings, spark, monkeypatch, capsys):
    dest = f"s3://{settings.bucket}/exports/spark"
    fs, base = ex.filesystem_for(dest, settings)
    assert _job(settings, monkeypatch, "--dest", dest) == 0
    first = ex.read_manifest(fs, base)
    assert first.export_id and all(first.export_id in p.path for t in first.tables.values() for p in t.files)

    assert _job(settings, monkeypatch, "--dest", dest) == 1  # Airflow's retry into a complete export
    assert "already holds a complete export" in capsys.readouterr().err
    assert ex.read_manifest(fs, base).export_id == first.export_id

    def broken(*a, **k):
        raise TieringError("the database went away before the manifest")

    with monkeypatch.context() as m:
        m.setattr(ex, "build_manifest", broken)
        assert _job(settings, monkeypatch, "--dest", dest, "--overwrite") == 1
    assert _files(fs, base) == []  # no manifest over new parts, no parts behind

    assert _job(settings, monkeypatch, "--dest", dest) == 0  # the retry into the now empty location
    again = ex.read_manifest(fs, base)
    assert again.export_id != first.export_id and again.row_counts["ledger"] == 2


def test_uploads_a_killed_export_left_in_progress_are_aborted_by_the_next(world, db, settings, s3_client):
    """No listing of objects shows a multipart upload in progress, and GC looks only under the store's own
    prefixes: the next export's claim of the location aborts those of its parts (and only those)."""
    fs, base = ex.filesystem_for(f"s3://{settings.bucket}/elsewhere/exp", settings)
    prefix = base.split("/", 1)[1]
    killed = s3_client.create_multipart_upload(Bucket=settings.bucket, Key=f"{prefix}/topic/part-dead-00000.parquet")
    foreign = s3_client.create_multipart_upload(Bucket=settings.bucket, Key=f"{prefix}/topic/notes.txt")

    def open_uploads():
        return {u["UploadId"] for u in s3_client.list_multipart_uploads(Bucket=settings.bucket,
                                                                         Prefix=prefix + "/").get("Uploads", [])}
    assert {killed["UploadId"], foreign["UploadId"]} <= open_uploads()
    ex.export_metadata(db, fs, base)
    assert open_uploads() == {foreign["UploadId"]}  # not a part's name: not an export's, left alone
    s3_client.abort_multipart_upload(Bucket=settings.bucket, Key=f"{prefix}/topic/notes.txt",
                                     UploadId=foreign["UploadId"])


def test_pgjdbc_gets_the_urls_server_options(spark, database_url):
    """Spark's JDBC reads (the export's, `tiering-sql`'s) see the server options of the URL as psycopg2 and
    pyiceberg do: the search_path through which the catalog's tables are found."""
    from urllib.parse import quote

    from tiering.spark.sql import jdbc_url

    sep = "&" if "?" in database_url else "?"
    url, user, password = jdbc_url(f"{database_url}{sep}options={quote('-c search_path=extra,public')}")
    [row] = (spark.read.format("jdbc").option("url", url).option("user", user).option("password", password)
             .option("driver", "org.postgresql.Driver")
             .option("query", "SELECT current_setting('search_path') AS p").load().collect())
    assert row.p == "extra,public"
