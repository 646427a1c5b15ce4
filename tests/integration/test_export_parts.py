"""The export's manifest is written only over parts the writer of the manifest can see (on a
cluster, executors write a local path on their own disks: a manifest the driver wrote there would
describe parts it never saw)."""
from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from tiering.errors import TieringError
from tiering.ops import export_metadata as ex


def _parts(base):
    fs = pafs.LocalFileSystem()
    parts = {t: [ex.write_part(fs, str(base), t, 0, ex.arrow_schema(t).empty_table(), "e1")]
             for t in ex.table_names()}
    return fs, parts


def test_a_missing_part_fails_the_export_before_the_manifest(db, tmp_path):
    fs, parts = _parts(tmp_path)
    (tmp_path / parts["chunk"][0].path).unlink()  # as if an executor had written it on another machine
    manifest = ex.build_manifest(db, parts)
    with pytest.raises(TieringError) as err:
        ex.write_manifest(fs, str(tmp_path), manifest)
    assert "chunk/part-e1-00000.parquet" in str(err.value) and "missing" in str(err.value)
    assert not (tmp_path / ex.MANIFEST).exists()


def test_a_part_with_other_rows_than_reported_fails(db, tmp_path):
    fs, parts = _parts(tmp_path)
    parts["topic"] = [ex.PartFile(parts["topic"][0].path, 5)]
    with pytest.raises(TieringError, match="has 0 rows"):
        ex.write_manifest(fs, str(tmp_path), ex.build_manifest(db, parts))
    assert not (tmp_path / ex.MANIFEST).exists()


def test_complete_parts_get_their_manifest(db, tmp_path):
    fs, parts = _parts(tmp_path)
    ex.write_manifest(fs, str(tmp_path), ex.build_manifest(db, parts))
    assert ex.read_manifest(fs, str(tmp_path)).row_counts == {t: 0 for t in ex.table_names()}
