"""An export's manifest.json is input: whatever it holds, reading it is BadInput with a sentence, never another
exception (which the CLI reports as a failure, exit 1)."""
import pytest

from tiering.errors import BadInput
from tiering.ops.export_metadata import FORMAT, FORMAT_VERSION, Manifest


def _manifest(rows: str) -> str:
    return (f'{{"format": "{FORMAT}", "format_version": {FORMAT_VERSION}, "exported_at": "2026-01-01T00:00:00Z", '
            f'"migrations": [], "tables": {{"topic": {{"rows": {rows}, "files": []}}}}}}')


@pytest.mark.parametrize("data", [
    "[" * 100_000,  # RecursionError in json.loads
    _manifest("1e400"),  # float infinity: OverflowError in int()
    _manifest("NaN"),
])
def test_a_hostile_manifest_is_bad_input(data):
    with pytest.raises(BadInput, match="is malformed"):
        Manifest.from_json(data, "x/manifest.json")


@pytest.mark.parametrize("rows", ["true", "2.5", "-1", str(2**63), '"3"'])
def test_a_count_must_be_a_json_integer_within_a_bigint(rows):
    with pytest.raises(BadInput, match="topic's rows must be a whole number from 0 to 9223372036854775807"):
        Manifest.from_json(_manifest(rows), "x/manifest.json")


@pytest.mark.parametrize("value", ["true", "2.5", "-4", str(2**63)])
def test_a_sequence_must_be_a_json_integer_within_a_bigint(value):
    # 2**63 reached setval, whose error the CLI reported as an old schema (exit 1)
    data = _manifest("3")[:-1] + f', "sequences": {{"topic.topic_id": {value}}}}}'
    with pytest.raises(BadInput, match="sequence topic.topic_id must be a whole number"):
        Manifest.from_json(data, "x/manifest.json")
    assert Manifest.from_json(data.replace(value, "null"), "x/manifest.json").sequences == {"topic.topic_id": None}


@pytest.mark.parametrize("version", ["true", "1.0", '"1"', "2"])
def test_a_format_version_other_than_the_integer_1_is_refused(version):
    data = _manifest("3").replace(f'"format_version": {FORMAT_VERSION}', f'"format_version": {version}')
    with pytest.raises(BadInput, match="export format version"):
        Manifest.from_json(data, "x/manifest.json")


def test_a_well_formed_manifest_still_reads():
    assert Manifest.from_json(_manifest("3"), "x/manifest.json").row_counts == {"topic": 3}


def test_a_manifest_that_is_not_a_regular_file_is_bad_input(tmp_path):
    # a fifo blocked import-metadata forever in open(); a directory failed as an I/O error (exit 1)
    import os
    import threading

    import pyarrow.fs as pafs

    from tiering.ops.export_metadata import read_manifest

    fifo, folder = tmp_path / "fifo", tmp_path / "folder"
    fifo.mkdir(), folder.mkdir()
    os.mkfifo(fifo / "manifest.json")
    (folder / "manifest.json").mkdir()
    said = {}

    def read(base):
        try:
            read_manifest(pafs.LocalFileSystem(), str(base))
        except BadInput as exc:
            said[base] = str(exc)

    for base in (fifo, folder):
        reader = threading.Thread(target=read, args=(base,), daemon=True)
        reader.start()
        reader.join(10)
        if reader.is_alive():  # release the blocked open() so the test process can end
            with open(fifo / "manifest.json", "wb"):
                pass
        assert "is not a regular file" in said.get(base, "blocked")


@pytest.mark.parametrize("path", ["../../etc/x.parquet", "/etc/x.parquet", "topic/../ledger/p.parquet",
                                  "ledger/p.parquet", "topic//p.parquet"])
def test_a_part_outside_its_tables_directory_is_refused(path):
    data = _manifest("1").replace('"files": []', f'"files": [{{"path": "{path}", "rows": 1}}]')
    with pytest.raises(BadInput, match="outside its table's directory topic/"):
        Manifest.from_json(data, "x/manifest.json")
    assert Manifest.from_json(data.replace(path, "topic/p.parquet"), "x/manifest.json").tables["topic"].files[0].path \
        == "topic/p.parquet"



@pytest.mark.parametrize("digest", ['"abc"', '"' + "A" * 64 + '"', "7", '"' + "0" * 63 + 'g"'])
def test_a_parts_digest_must_be_64_lower_case_hex_digits(digest):
    data = _manifest("1").replace('"files": []', f'"files": [{{"path": "topic/p.parquet", "rows": 1, "sha256": {digest}}}]')
    with pytest.raises(BadInput, match="sha256 must be 64 lower-case hex digits"):
        Manifest.from_json(data, "x/manifest.json")
    ok = Manifest.from_json(data.replace(digest, '"' + "0a" * 32 + '"'), "x/manifest.json")
    assert ok.tables["topic"].files[0].sha256 == "0a" * 32


@pytest.mark.parametrize("bucket", ['""', "7", '"a/b"', '"user:pw@host"', '"' + "b" * 256 + '"', '"a\\nb"'])
def test_the_bucket_a_manifest_names_must_be_a_bucket_name(bucket):
    data = _manifest("1")[:-1] + f', "bucket": {bucket}}}'
    with pytest.raises(BadInput, match="bucket must be a bucket name"):
        Manifest.from_json(data, "x/manifest.json")
    assert Manifest.from_json(data.replace(bucket, '"tier2.b-1"'), "x/manifest.json").bucket == "tier2.b-1"
    assert Manifest.from_json(data.replace(bucket, "null"), "x/manifest.json").bucket is None  # an older export
