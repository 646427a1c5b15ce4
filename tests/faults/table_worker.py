"""Fault-injection worker for table sync: `python -m tests.faults.table_worker` syncs every topic with a
table (settings from the environment, as in production) and stops dead at FAULT_POINT (planned, written or
committed: tiering/tables/sync.py), saying `AT <point>` and sleeping until the test kills it with SIGKILL.
`DONE <json>` when it ran to the end."""
from __future__ import annotations

import json
import os
import time

from tiering import clients
from tiering.config import Settings
from tiering.tables.catalog import catalog
from tiering.tables.files import local_writer
from tiering.tables.sync import TableSync, sync_tables


def say(line: str) -> None:
    print(line, flush=True)


def main() -> None:
    point = os.environ.get("FAULT_POINT")

    def fault(step: str) -> None:
        if step == point:
            say(f"AT {step}")
            while True:
                time.sleep(60)

    settings = Settings.from_env()
    deps = clients.deps(settings)
    sync = TableSync(deps.meta.engine, settings, catalog(settings), fault=fault)
    say("READY")
    results = sync_tables(sync, local_writer(deps, settings))
    say("DONE " + json.dumps([{"topic": r.topic, "status": r.status, "ledgers": r.ledgers} for r in results]))


if __name__ == "__main__":
    main()
