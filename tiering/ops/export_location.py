"""An export's location and its lifecycle: one export at a time per location, every
part file identified as the export's own, nothing left behind by a failed one.

- Each export has an id (`new_export_id`). Its parts are named `{table}/part-{id}-{n:05d}.parquet` and carry
  the id in their Parquet metadata (`tiering.export_id`); the manifest records it, and `check_parts` (in
  export_metadata.py) refuses a part whose footer names another export: a stale part of an earlier export at
  the same path can no longer pass for this one's.
- `claim` before the first part: a location that holds a complete export (a manifest) is refused unless
  `overwrite`; then the manifest goes FIRST, so a failure midway leaves a recognisably incomplete export,
  never an old manifest over new parts. What earlier, incomplete exports left there (parts without a
  manifest: a killed driver's) is removed. On a local path it writes the export's marker `_exporting-{id}`.
- `check_shared` on each executor before it writes a part to a local path: the marker must be visible
  there. An executor on another machine does not see the driver's disk; it writes nothing and says so,
  instead of leaving parts on its own disk that no one would ever collect.
- `discard` after a failure: this export's parts and marker go (on S3, and on local paths the driver sees).
  `release` after the manifest: the marker goes.

A location is written by one export at a time; two exports into the same location at once defeat each
other (the second's `claim` removes the first's parts) and both fail their checks: neither writes a manifest.
"""
from __future__ import annotations

import uuid

import pyarrow.fs as pafs

from tiering.errors import BadInput, TieringError
from tiering.metadata.export_rows import table_names

MANIFEST = "manifest.json"
EXPORT_ID_KEY = "tiering.export_id"  # in each part's Parquet (Arrow schema) metadata
_MARKER = "_exporting-"


class ExportNotShared(TieringError):
    """An executor does not see the export's local path as the driver does."""


def new_export_id() -> str:
    return uuid.uuid4().hex[:16]


def join(base: str, *names: str) -> str:
    return "/".join([base.rstrip("/"), *names])


def exists(fs: pafs.FileSystem, path: str) -> bool:
    return fs.get_file_info(path).type != pafs.FileType.NotFound


def is_local(fs: pafs.FileSystem) -> bool:
    return fs.type_name == "local"


def part_name(table: str, part_no: int, export_id: str) -> str:
    """A part's path relative to the base path."""
    return f"{table}/part-{export_id}-{part_no:05d}.parquet"


def claim(fs: pafs.FileSystem, base: str, export_id: str, overwrite: bool) -> None:
    """Make `base` this export's: refuse a complete export there unless `overwrite` (then its manifest is
    deleted first), remove leftovers of incomplete exports, and on a local path write the marker."""
    manifest = join(base, MANIFEST)
    if exists(fs, manifest):
        if not overwrite:
            raise BadInput(f"{base!r} already holds a complete export; choose a new location or overwrite")
        fs.delete_file(manifest)  # first: from here on the location is an incomplete export, never a mixed one
    for table in table_names():  # no manifest here now: whatever parts are left belong to no export
        if exists(fs, join(base, table)):
            fs.delete_dir_contents(join(base, table), missing_dir_ok=True)
    if is_local(fs):
        for old in _markers(fs, base):
            fs.delete_file(old)
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(join(base, _MARKER + export_id)) as out:
            out.write(export_id.encode())


def check_shared(fs: pafs.FileSystem, base: str, export_id: str, host: str) -> None:
    """On an executor, before writing a part: a local path must show the driver's marker (S3 is shared)."""
    if is_local(fs) and not exists(fs, join(base, _MARKER + export_id)):
        raise ExportNotShared(f"export location {base} on {host} is not the driver's (its marker is missing): "
                              f"export to s3:// or to a path every Spark worker shares; nothing written there")


def discard(fs: pafs.FileSystem, base: str, export_id: str) -> int:
    """Remove this export's parts and marker after a failure; how many files went. Best effort per file:
    a part that cannot be removed now is removed by the next export's `claim` of the location."""
    gone = 0
    for table in table_names():
        for info in _listing(fs, join(base, table)):
            if info.base_name.startswith(f"part-{export_id}-"):
                gone += _delete(fs, info.path)
    if is_local(fs):
        gone += _delete(fs, join(base, _MARKER + export_id))
    return gone


def release(fs: pafs.FileSystem, base: str, export_id: str) -> None:
    """After the manifest: the marker is no longer needed."""
    if is_local(fs):
        _delete(fs, join(base, _MARKER + export_id))


def _listing(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    try:
        return [i for i in fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))
                if i.type == pafs.FileType.File]
    except OSError:
        return []


def _markers(fs: pafs.FileSystem, base: str) -> list[str]:
    return [i.path for i in _listing(fs, base) if i.base_name.startswith(_MARKER)]


def _delete(fs: pafs.FileSystem, path: str) -> int:
    try:
        fs.delete_file(path)
        return 1
    except (FileNotFoundError, OSError):
        return 0
