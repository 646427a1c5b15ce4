"""The managed-ledger writer: `append(payload) -> Position`, rolling over to a new ledger by the topic's
entries/bytes policy (Pulsar's managed ledger). One writer process owns a topic at a time.

Exactly-once appends (optional): with a writer id and an event number, the writer's last event number is
a topic attribute updated by replace-if-equals, so a retried append of an already written event is not
written twice and a second process using the same writer id loses the compare-and-set. The entry and the
attribute are not one atomic write (they live in a file and in PostgreSQL): a crash between the two leaves
the entry written and the event unrecorded, so that one retry is written again.
"""
from __future__ import annotations

from dataclasses import dataclass

from tiering.errors import BadInput, TopicBeingDeleted, TopicNotFound, TopicReplaced
from tiering.format.block import MAX_ENTRY_LEN
from tiering.metadata.attributes import Attributes, AttributeUpdate, Verb
from tiering.metadata.repository import MetadataStore
from tiering.model import Ledger, LedgerState, Position
from tiering.tier1 import LedgerFileExists, Tier1Store

# The largest entry a producer may write: under the format's limit (what tier 1 and tier 2 can store and read
# back) by an entry header, so that every payload is also one value of an Arrow binary array (at most 2^31 - 2
# bytes), which read_batches, the Spark source and table sync build
MAX_ENTRY_BYTES = MAX_ENTRY_LEN - 12


@dataclass(frozen=True)
class AppendResult:
    position: Position | None
    duplicate: bool = False


class ManagedLedgerWriter:
    def __init__(self, meta: MetadataStore, tier1: Tier1Store, topic_name: str, discard_damaged: bool = False):
        self.meta = meta
        self.tier1 = tier1
        self.topic = meta.get_topic(topic_name)
        self.attributes = Attributes(meta.engine)
        self._ledger: Ledger | None = None
        self._writer = None
        self._entries = 0
        self._bytes = 0
        self.sealed_on_open: Ledger | None = None  # the open ledger, if its file was found sealed (below)
        self.recovery = None  # what resuming the open ledger's file cut (tier1.RecoveryInfo), if there was one
        # with `discard_damaged`: the intact entries cut after a damaged one, (first, last) at least, and the
        # subscriptions that had not read them, with how many each lost (recorded before the cut)
        self.discarded: tuple[int, int] | None = None
        self.discard_losses: list[tuple[str, int]] = []
        open_ = meta.list_ledgers(topic_name, [LedgerState.OPEN])
        if open_:  # resume the open ledger; a crash may have torn its tail
            self._ledger = open_[0]
            # An OPEN row always has its file (made before the row, below): a missing one is a wrong tier-1
            # root or a lost file, and writing a new file would hand out its positions a second time.
            self._writer = tier1.open_writer(topic_name, self._ledger.ledger_id, discard_damaged,
                                             before_discard=self._record_discard if discard_damaged else None)
            self.recovery = self._writer.recovery
            self._entries = self._writer.entry_count
            self._bytes = self._writer.size_bytes
            if self._writer.sealed:
                # killed between sealing the file and recording it: the file is final, so its seal is
                # recorded now (its counts from the file) and the next append starts the next ledger
                self.sealed_on_open = self.seal()

    def _record_discard(self, plan) -> None:
        """Entries plan.kept..plan.last_intact (at least) are about to be cut: the subscriptions that had not
        read them lose them, recorded before the cut (metadata/subscriptions.record_discard)."""
        led = self._ledger
        lost = self.meta.subs.record_discard(self.topic.name, self.topic.topic_id, led.ledger_id, plan.kept,
                                             plan.last_intact, plan.payload_bytes)
        self.discarded = (plan.kept, plan.last_intact)
        self.discard_losses = lost or []

    def append(self, payload: bytes) -> Position:
        if not isinstance(payload, (bytes, bytearray, memoryview)):
            raise BadInput("an entry is bytes")
        if len(payload) > MAX_ENTRY_BYTES:
            raise BadInput(f"an entry is at most {MAX_ENTRY_BYTES} bytes, got {len(payload)}")
        if self._writer is None:
            self._open_next()
        entry_id = self._writer.append(bytes(payload))
        self._entries += 1
        self._bytes += len(payload)
        position = Position(self._ledger.ledger_id, entry_id)
        policy = self.topic.policy
        if self._entries >= policy.rollover_entries or self._bytes >= policy.rollover_bytes:
            self.seal()
        return position

    def _open_next(self) -> None:
        """The next ledger: its empty file first, then its OPEN row (by compare-and-set on the topic's next
        id). Killed in between, an empty file with no row is left, which the next writer takes over; the
        other order left a row without a file, which a later writer could not tell from a wrong root."""
        name = self.topic.name
        self.tier1.check_root()
        now = self.meta.get_topic(name)
        if now.topic_id != self.topic.topic_id:
            # deleted and created again while this writer was between ledgers: the entries it is handed were
            # meant for the topic that is gone, not for the new one (Pulsar fences a deleted topic's producers)
            raise TopicReplaced(name)
        ledger_id = now.next_ledger_id
        try:
            writer = self.tier1.create_ledger(name, ledger_id)
        except LedgerFileExists:
            # a file no row names yet (raises while another writer holds it)
            writer = self.tier1.open_writer(name, ledger_id, has_row=False)
            if writer.entry_count:
                writer.close()
                raise LedgerFileExists(f"ledger {ledger_id} of topic {name!r} has entries in tier 1 but no row "
                                       "in metadata: it is not written over") from None
        try:
            self._ledger = self.meta.open_ledger(name, ledger_id, self.topic.topic_id)
        except (TopicBeingDeleted, TopicNotFound):  # TopicReplaced too
            # no row will ever name this empty file: removed while this writer still holds it, or a delete of
            # the topic would meet it held, or find it left over after its end
            self.tier1.delete(name, ledger_id)
            writer.close()
            raise
        except BaseException:
            writer.close()
            raise
        self._writer = writer
        self._entries = self._bytes = 0

    def append_once(self, payload: bytes, writer_id: str, event_number: int) -> AppendResult:
        """Append unless this writer's event `event_number` was already appended."""
        if event_number < 0:
            raise BadInput("event numbers are non-negative")
        key = f"writer:{writer_id}"
        last = self.attributes.get(self.topic.name, key)
        if last is not None and event_number <= last:
            return AppendResult(None, duplicate=True)
        position = self.append(payload)
        # ConditionalUpdateFailed here: another process used this writer id meanwhile; the caller must know.
        self.attributes.update(self.topic.name, [AttributeUpdate(key, Verb.REPLACE_IF_EQUALS, event_number,
                                                                 expected=last)])
        return AppendResult(position)

    def seal(self) -> Ledger | None:
        """Seal the open ledger (fsync, then record count, size and time in metadata)."""
        if self._writer is None:
            return None
        info = self._writer.seal()
        sealed = self.meta.seal_ledger(self._ledger, info.entry_count, info.size_bytes)
        self._writer = None
        self._ledger = None
        return sealed

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
