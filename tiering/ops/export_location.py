"""An export's location and its lifecycle: one export at a time per location, every
part file identified as the export's own, nothing left behind by a failed one.

- Each export has an id (`new_export_id`). Its parts are named `{table}/part-{id}-{n:05d}.parquet` and carry
  the id in their Parquet metadata (`tiering.export_id`); the manifest records it, and `check_parts` (in
  export_metadata.py) refuses a part whose footer names another export: a stale part of an earlier export at
  the same path can no longer pass for this one's.
- `claim` before the first part: a location that holds a complete export (a manifest) is refused unless
  `overwrite`; then the manifest goes FIRST, so a failure midway leaves a recognisably incomplete export,
  never an old manifest over new parts. What earlier, incomplete exports left there (parts without a
  manifest: a killed driver's; on S3 also the uploads of parts it left in progress) is removed: only files
  that are such parts (named `part-ID-NNNNN.parquet`, or `part-NNNNN.parquet` before exports had ids, with
  this format's table and the same id in their Parquet metadata; on a local path also a part of an id with a
  marker there, which a killed writer may have left without its footer). A table directory holding anything else is someone else's: the location is refused
  before anything is removed or written. On a local path it writes the export's marker `_exporting-{id}`.
- `check_shared` on each executor before it writes a part to a local path: the marker must be visible
  there. An executor on another machine does not see the driver's disk; it writes nothing and says so,
  instead of leaving parts on its own disk that no one would ever collect.
- `discard` after a failure: this export's parts and marker go (on S3, and on local paths the driver sees).
  `release` after the manifest: the marker goes.

A location is written by one export at a time: its driver holds a lock on the location in the metadata
database (`only_writer`) from its claim to its manifest; a second export finds it held and fails with
`LocationTaken` before touching anything. Beyond that lock (exports of two databases into one location), the manifest is
created only if there is none (`create_manifest`: a hard link on a local path, a PUT with `If-None-Match: *`
on S3), so one of them at most writes it; the other fails with `LocationTaken` and removes its parts. A
`claim` that removes the parts of an export still running makes that one fail its check before the manifest,
or its check after it (then it deletes the manifest it wrote): no manifest stays over missing parts.
"""
from __future__ import annotations

import os
import re
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from tiering.errors import BadInput, TieringError
from tiering.metadata import export_lock
from tiering.metadata.export_rows import table_names
from tiering.tier2.arrowfs import abort_uploads_under, create_object_if_absent

MANIFEST = "manifest.json"
EXPORT_ID_KEY = "tiering.export_id"  # in each part's Parquet (Arrow schema) metadata
TABLE_KEY = "tiering.table"  # beside it: the table the part's rows are of
_MARKER = "_exporting-"
_PART = re.compile(r"part-(?:(?P<id>[A-Za-z0-9][A-Za-z0-9-]*)-)?\d{5,}\.parquet")  # see part_name


class LocationTaken(TieringError):
    """Another export wrote its manifest into the location first (two exports into one location at once)."""


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


@contextmanager
def only_writer(engine, fs: pafs.FileSystem, base: str) -> Iterator[None]:
    """Hold the location for one export from its `claim` to its manifest (metadata/export_lock.py), or raise
    LocationTaken at once when another export holds it: nothing is read, removed or written then."""
    with export_lock.writing(engine, f"{fs.type_name}:{base.rstrip('/')}") as mine:
        if not mine:
            raise LocationTaken(f"another export is writing to {base!r} now; nothing written (rerun it later)")
        yield


def check_claimable(fs: pafs.FileSystem, base: str, overwrite: bool) -> tuple[bool, list[str]]:
    """What `claim` refuses, found without writing anything (BadInput): a complete export at `base` unless
    `overwrite`, a table directory with files that are not parts of an export. Returns (a complete export is
    there, the leftover parts of incomplete exports)."""
    complete = exists(fs, join(base, MANIFEST))
    if complete and not overwrite:
        raise BadInput(f"{base!r} already holds a complete export; choose a new location or overwrite")
    return complete, _leftovers(fs, base)


def claim(fs: pafs.FileSystem, base: str, export_id: str, overwrite: bool) -> None:
    """Make `base` this export's: refuse a complete export there unless `overwrite` (then its manifest is
    deleted first), refuse a table directory with files that are not parts of an export (BadInput, nothing
    touched), remove leftovers of incomplete exports, and on a local path write the marker."""
    manifest = join(base, MANIFEST)
    complete, leftovers = check_claimable(fs, base, overwrite)  # before any change: a refused location is left as it was
    if complete:
        try:
            fs.delete_file(manifest)  # first: from here on the location is an incomplete export, never a mixed one
        except FileNotFoundError:  # another export overwriting it at once deleted it first
            raise LocationTaken(f"another export is overwriting {base!r} at the same time; nothing written") from None
    for path in leftovers:
        if exists(fs, manifest):  # an export running here has just completed: these parts are its own now
            raise LocationTaken(f"another export took {base!r} while this one was starting; nothing written")
        _delete(fs, path)
    if not is_local(fs):  # a killed export's parts in progress: no listing shows them, nothing else aborts them
        for table in table_names():
            abort_uploads_under(fs, join(base, table),
                                keep=lambda key: bool(_PART.fullmatch(key.rsplit("/", 1)[-1])))
    if is_local(fs):
        for old in _markers(fs, base):
            fs.delete_file(old)
        fs.create_dir(base, recursive=True)
        with fs.open_output_stream(join(base, _MARKER + export_id)) as out:
            out.write(export_id.encode())


def _leftovers(fs: pafs.FileSystem, base: str) -> list[str]:
    """The parts earlier exports left in the table directories; BadInput if anything else is there."""
    marked = {p.rsplit("/", 1)[-1][len(_MARKER):] for p in _markers(fs, base)} if is_local(fs) else set()
    ours, foreign = [], []
    for table in table_names():
        where = join(base, table)
        for info in _entries(fs, where):  # a file at the table's own path is foreign
            (ours if info.path != where and _is_part(fs, info, table, marked) else foreign).append(info.path)
    if foreign:
        more = f" and {len(foreign) - 1} more" if len(foreign) > 1 else ""
        raise BadInput(f"{base!r} is not an export location: {foreign[0]}{more} is not a part of a metadata "
                       f"export; choose another location (nothing written or removed)")
    return ours


def _is_part(fs: pafs.FileSystem, info: pafs.FileInfo, table: str, marked: set[str]) -> bool:
    """A part of an export of `table`: its name, and its footer's table and export id (the name alone could
    be anyone's file)."""
    name = _PART.fullmatch(info.base_name) if info.type == pafs.FileType.File else None
    if name is None:
        return False
    if name["id"] is not None and name["id"] in marked:  # a killed writer's part may have no footer yet
        return True
    try:
        footer = read_footer(fs, info.path)
    except (OSError, ValueError):  # not Parquet (ArrowInvalid is a ValueError)
        return False
    return footer.table == table and footer.export_id == name["id"]


@dataclass(frozen=True)
class PartFooter:
    rows: int
    table: str | None  # what its metadata names (None: not named)
    export_id: str | None


def read_footer(fs: pafs.FileSystem, path: str) -> PartFooter:
    """A part's row count and the table and export its Parquet metadata names: what tells this export's part
    from anyone's file of the same name and rows. OSError, or ValueError (pyarrow's ArrowInvalid) when it is
    not a readable Parquet file."""
    with fs.open_input_file(path) as f:
        meta = pq.ParquetFile(f).metadata
    named = meta.metadata or {}

    def text(key: str) -> str | None:
        return named.get(key.encode(), b"").decode(errors="replace") or None
    return PartFooter(meta.num_rows, text(TABLE_KEY), text(EXPORT_ID_KEY))


def create_manifest(fs: pafs.FileSystem, base: str, data: bytes, export_id: str) -> str:
    """Create the manifest only if there is none, atomically: one of two exports into a location at once
    writes it, the other gets LocationTaken."""
    path = join(base, MANIFEST)
    taken = LocationTaken(f"another export took {base!r} (its manifest is there); this export's parts are "
                          f"removed, nothing of it stays")
    if is_local(fs):
        fs.create_dir(base, recursive=True)
        tmp = f"{path}.{export_id}.tmp"  # one per export: two writers never share it
        with fs.open_output_stream(tmp) as out:
            out.write(data)
        try:
            os.link(tmp, path)  # readers see no manifest or a whole one; fails if one exists
        except FileExistsError:
            raise taken from None
        finally:
            os.unlink(tmp)
        return path
    if not create_object_if_absent(fs, path, data):
        raise taken
    return path


def another_export(fs: pafs.FileSystem, base: str, table: str, export_id: str | None) -> bool:
    """Whether parts of another export are in `table`'s directory: a part of this one that is missing was
    then removed by that export's `claim`, not written on another machine."""
    return export_id is not None and any(
        (m := _PART.fullmatch(i.base_name)) is not None and m["id"] not in (None, export_id)
        for i in _listing(fs, join(base, table)))


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


def _entries(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """What is at `path`: nothing, the file itself, or a directory's entries (files and directories)."""
    where = fs.get_file_info(path)
    if where.type == pafs.FileType.NotFound:
        return []
    if where.type != pafs.FileType.Directory:
        return [where]
    return fs.get_file_info(pafs.FileSelector(path, allow_not_found=True))


def _listing(fs: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    """The files at `path` (best effort: a listing that fails is empty, for the clean-up after a failure)."""
    try:
        return [i for i in _entries(fs, path) if i.type == pafs.FileType.File]
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
