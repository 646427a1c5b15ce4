"""Worker functions run in separate processes by the race tests (top level so `spawn` can import them)."""
from __future__ import annotations


def _wait(barrier):
    if barrier is not None:
        barrier.wait(timeout=30)


def accumulate(url: str, topic: str, key: str, times: int, barrier) -> int:
    from tiering.metadata import make_engine
    from tiering.metadata.attributes import Attributes, AttributeUpdate, Verb

    attrs = Attributes(make_engine(url))
    _wait(barrier)
    for _ in range(times):
        attrs.update(topic, [AttributeUpdate(key, Verb.ACCUMULATE, 1)])
    return times


def replace_if_equals(url: str, topic: str, key: str, expected, value: int, barrier) -> bool:
    from tiering.errors import ConditionalUpdateFailed
    from tiering.metadata import make_engine
    from tiering.metadata.attributes import Attributes, AttributeUpdate, Verb

    attrs = Attributes(make_engine(url))
    _wait(barrier)
    try:
        attrs.update(topic, [AttributeUpdate(key, Verb.REPLACE_IF_EQUALS, value, expected=expected)])
        return True
    except ConditionalUpdateFailed:
        return False


def seal_ledger(url: str, topic: str, ledger_id: int, entries: int, barrier) -> bool:
    from tiering.errors import ConditionalUpdateFailed
    from tiering.metadata import make_engine
    from tiering.metadata.repository import MetadataStore

    meta = MetadataStore(make_engine(url))
    led = meta.get_ledger(topic, ledger_id)
    _wait(barrier)
    try:
        meta.seal_ledger(led, entries, entries * 10)
        return True
    except ConditionalUpdateFailed:
        return False


def upgrade(url: str, barrier) -> list[str]:
    from tiering.metadata import make_engine, upgrade as run

    engine = make_engine(url)
    _wait(barrier)
    return run(engine).applied
