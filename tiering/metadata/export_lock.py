"""One metadata export at a time per location, across processes and machines that share the database.

The manifest is created only if absent (ops/export_location.py), so of two exports racing into one
location at most one completes; but a `claim` removes what it takes for an earlier export's leftovers, and
that could be a part a running export had just written. A session advisory lock on the location, held by the
export's driver from its claim to its manifest, closes that: a second export finds it held and stops before
touching anything. Killed, the driver loses the lock with its connection."""
from __future__ import annotations

from sqlalchemy import func, literal
from sqlalchemy.engine import Engine

from tiering.metadata.db import session_lock

LOCK_CLASS = 0x6578706c  # "expl" (two-key advisory locks: metadata/attempt_locks.py)


def writing(engine: Engine, location: str):
    """`with writing(...) as held:` True while this process holds the export lock of `location`, False when
    another session does (it does not wait; metadata/db.session_lock). Two locations whose names hash alike
    share a lock: the later export waits its turn (fails, to be rerun), never writes beside the other."""
    return session_lock(engine, LOCK_CLASS, func.hashtext(literal(location)))
