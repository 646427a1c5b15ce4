"""64-bit attributes of a topic or a ledger with the four update verbs of Pravega's segment attributes.

A batch of updates on several keys is applied in one transaction: if one condition fails, none is applied
and `ConditionalUpdateFailed` says which key, what was expected and what was found.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from sqlalchemy import select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Engine

from tiering.errors import BadInput, ConditionalUpdateFailed, TopicNotFound
from tiering.metadata.tables import attribute, topic
from tiering.model import check_topic_name

TOPIC_SCOPE = -1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Verb(str, enum.Enum):
    REPLACE = "replace"
    REPLACE_IF_GREATER = "replace-if-greater"
    REPLACE_IF_EQUALS = "replace-if-equals"
    ACCUMULATE = "accumulate"


@dataclass(frozen=True)
class AttributeUpdate:
    key: str
    verb: Verb
    value: int
    expected: int | None = None  # for REPLACE_IF_EQUALS; None means "not set"

    def __post_init__(self):
        if not (INT64_MIN <= self.value <= INT64_MAX):
            raise BadInput(f"attribute {self.key!r}: value {self.value} is not a 64-bit integer")
        if not self.key or len(self.key) > 256:
            raise BadInput("attribute keys are 1 to 256 characters")


class Attributes:
    def __init__(self, engine: Engine):
        self.engine = engine

    def get(self, topic_name: str, key: str, ledger_id: int = TOPIC_SCOPE) -> int | None:
        return self.get_all(topic_name, ledger_id).get(key)

    def get_all(self, topic_name: str, ledger_id: int = TOPIC_SCOPE) -> dict[str, int]:
        with self.engine.connect() as conn:
            tid = _topic_id(conn, topic_name)
            rows = conn.execute(select(attribute.c.key, attribute.c.value)
                                .where(attribute.c.topic_id == tid, attribute.c.ledger_id == ledger_id))
            return dict(rows.all())

    def update(self, topic_name: str, updates: list[AttributeUpdate],
               ledger_id: int = TOPIC_SCOPE) -> dict[str, int]:
        """Apply all updates atomically; returns each key's new value."""
        if len({u.key for u in updates}) != len(updates):
            raise BadInput("a batch may update each attribute key once")
        result: dict[str, int] = {}
        with self.engine.begin() as conn:
            tid = _topic_id(conn, topic_name)
            # a fixed key order keeps concurrent batches from deadlocking
            for u in sorted(updates, key=lambda u: u.key):
                result[u.key] = self._apply(conn, tid, ledger_id, u)
        return result

    def _apply(self, conn, tid: int, lid: int, u: AttributeUpdate) -> int:
        where = (attribute.c.topic_id == tid, attribute.c.ledger_id == lid, attribute.c.key == u.key)
        base = insert(attribute).values(topic_id=tid, ledger_id=lid, key=u.key, value=u.value)
        pk = [attribute.c.topic_id, attribute.c.ledger_id, attribute.c.key]
        now_values = {"updated_at": base.excluded.updated_at, "version": attribute.c.version + 1}
        if u.verb is Verb.REPLACE:
            stmt = base.on_conflict_do_update(index_elements=pk, set_={"value": u.value, **now_values})
        elif u.verb is Verb.ACCUMULATE:
            stmt = base.on_conflict_do_update(
                index_elements=pk, set_={"value": attribute.c.value + u.value, **now_values})
        elif u.verb is Verb.REPLACE_IF_GREATER:
            stmt = base.on_conflict_do_update(index_elements=pk, set_={"value": u.value, **now_values},
                                              where=attribute.c.value < u.value)
        elif u.expected is None:  # replace-if-equals "not set": only an insert may win
            stmt = base.on_conflict_do_nothing(index_elements=pk)
        else:
            stmt = (update(attribute).where(*where, attribute.c.value == u.expected)
                    .values(value=u.value, version=attribute.c.version + 1))
        row = conn.execute(stmt.returning(attribute.c.value)).one_or_none()
        if row is None:
            found = conn.execute(select(attribute.c.value).where(*where)).scalar_one_or_none()
            expected = {Verb.REPLACE_IF_GREATER: f"a value below {u.value}",
                        Verb.REPLACE_IF_EQUALS: "not set" if u.expected is None else str(u.expected)}[u.verb]
            raise ConditionalUpdateFailed(f"attribute {u.key!r} ({u.verb.value})", expected,
                                          "not set" if found is None else str(found))
        return row.value


def _topic_id(conn, name: str) -> int:
    check_topic_name(name, existing=True)
    tid = conn.execute(select(topic.c.topic_id).where(topic.c.name == name)).scalar_one_or_none()
    if tid is None:
        raise TopicNotFound(name)
    return tid
