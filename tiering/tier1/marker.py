"""The tier-1 root's identity: a marker file `{root}/.tiering-root` holding a random token.

On a cluster every worker must see the same tier-1 root (a shared mount at the same path). A worker that
sees another directory at that path (a local disk, an unmounted mount point) would find no files: offload
fails cleanly, but nothing should even start there. So the driver reads the token (creating the marker
the first time, in a root that exists), ships it with the plan, and each executor checks its root's
marker before any work (`check_root`), failing with the path when it differs or is missing.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path

from tiering.errors import LedgerStorageError
from tiering.tier1.ledger_file import fsync_dir

MARKER = ".tiering-root"


def _read(path: Path) -> str:
    return path.read_text(encoding="ascii", errors="replace").strip()


def root_token(root: Path | str) -> str | None:
    """The root's token, creating its marker when the root exists without one (atomic: the first of
    several concurrent creators wins, the others read its token). None when the root does not exist:
    nothing is created (it may be a mount point not mounted yet)."""
    root = Path(root)
    path = root / MARKER
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    if not root.is_dir():
        return None
    token = secrets.token_hex(16)
    tmp = root / f"{MARKER}.{token}.tmp"
    with open(tmp, "w", encoding="ascii") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # fails if another process created it meanwhile: theirs wins
    except FileExistsError:
        pass
    finally:
        tmp.unlink()
    fsync_dir(root)
    return _read(path)


def check_root(root: Path | str, token: str | None) -> None:
    """Raise LedgerStorageError (naming the path) unless `root` holds the marker with `token`. A token of
    None (the driver saw no root) checks nothing."""
    if token is None:
        return
    path = Path(root) / MARKER
    try:
        found = _read(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        raise LedgerStorageError(f"tier-1 root marker {path} cannot be read on this worker: {exc}") from None
    if found != token:
        what = "is missing" if found is None else "belongs to another directory"
        raise LedgerStorageError(
            f"tier-1 root {root} on this worker is not the driver's: its marker {path} {what}. Every Spark "
            f"worker must mount the same shared tier-1 directory at {root} (README, Running on a cluster)")
