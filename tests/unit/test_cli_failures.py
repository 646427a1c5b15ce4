"""The one line `tiering` prints for a failure it did not expect says what happened (cli/main.py)."""
from __future__ import annotations

from sqlalchemy.exc import OperationalError

from tiering.cli.main import describe_failure


class _PgError(Exception):
    def __init__(self, pgcode: str, text: str):
        super().__init__(text)
        self.pgcode = pgcode


def test_a_transaction_rolled_back_by_a_race_is_not_called_an_unavailable_database():
    # PostgreSQL's class 40 (deadlock_detected 40P01, serialization_failure 40001): the server answered
    for code, text in (("40P01", "deadlock detected\nDETAIL: Process 1 waits for ShareLock"),
                       ("40001", "could not serialize access due to concurrent update")):
        line = describe_failure(OperationalError("UPDATE tiering.ledger", {}, _PgError(code, text)))
        assert "unavailable" not in line and "run it again" in line and "\n" not in line, line
        assert line.endswith(text.splitlines()[0]), line


def test_a_connection_failure_is_still_an_unavailable_database():
    line = describe_failure(OperationalError("SELECT 1", {}, _PgError(None, "connection refused")))
    assert line.startswith("metadata database unavailable"), line
