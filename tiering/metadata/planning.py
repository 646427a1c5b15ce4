"""Set-based planning queries: what a scheduled offload-by-size, delete-lagged, retention, truncate
or defrag run has to do, read in one or a few statements that touch only candidate rows (partial indexes of
migrations 0001 and 0004, the per-topic totals of 0003), never a topic's whole history.

The pure functions of tiering/policy.py stay the specification: tests/integration/test_planning_sql.py
generates random metadata and asserts that each query here returns exactly what the policy function returns
on the same rows. `now` is the database's clock unless a caller pins it (the tests do).
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from sqlalchemy import func, literal, text
from sqlalchemy.engine import Connection, Engine

from tiering.metadata.attempt_locks import OFFLOAD_CLASS
from tiering.metadata.db import session_lock
from tiering.model import Chunk, Ledger, LedgerState

S = LedgerState
MARKER_CLASS = 0x74726d6b  # "trmk": one writer of a topic's trim marker at a time (Planning.marker_lock)

# Every ledger column as Ledger wants it; `l` is the ledger row, `name` the topic's name in scope.
_LEDGER_COLS = """l.topic_id, name, l.ledger_id, l.state::text AS state, l.entry_count, l.size_bytes,
    l.created_at, l.sealed_at, l.tier1_present, l.offload_uuid::text AS offload_uuid, l.offload_started_at,
    l.offloaded_at, l.deleted_at, l.version"""
_NOW = "COALESCE(CAST(:now AS timestamptz), now())"
# A subscription `s` of topic `t` is ACTIVE unless the topic expires subscriptions and `s` had no ack (nor
# was created) within the expiry: the one definition of EXPIRED (model.Subscription.state).
_ACTIVE = f"""(t.subscription_expiry_seconds < 0
               OR COALESCE(s.last_ack_at, s.created_at) > {_NOW} - make_interval(secs => t.subscription_expiry_seconds))"""
# Retention's walk (policy.retention_plan): ledger `l` read in full by the slowest ACTIVE subscription (no
# hold: true), and whether it goes, with the topic's bytes `rest` left without it.
_READ = "(l.held IS NULL OR l.entry_count = 0 OR (l.hl, l.he) >= (l.ledger_id, l.entry_count - 1))"
_GOES = """(COALESCE(((l.sealed_at <= {w}.cutoff OR ({w}.rb >= 0 AND {rest} >= {w}.rb))
                      AND ({w}.held IS NULL OR l.entry_count = 0 OR ({w}.hl, {w}.he) >= (l.ledger_id, l.entry_count - 1))),
                     false)
            OR COALESCE(l.sealed_at <= {w}.ccut, false) OR ({w}.cb >= 0 AND {rest} >= {w}.cb))"""


def _ledger(r) -> Ledger:
    return Ledger(r.topic_id, r.name, r.ledger_id, S(r.state), r.entry_count, r.size_bytes, r.created_at,
                  r.sealed_at, r.tier1_present, r.offload_uuid, r.offload_started_at, r.offloaded_at,
                  r.deleted_at, r.version)


@dataclass(frozen=True)
class SizeTopic:
    """A topic offload-by-size has to look at: a threshold and at least one offloadable ledger."""
    topic_id: int
    name: str
    open_ledger_id: int | None


@dataclass(frozen=True)
class DefragCandidate:
    """An OFFLOADED ledger whose chunk is small and alone in its data object; `joins_previous`: the
    previous ledger of the topic that is not a gap (DELETED or empty SEALED) is the previous candidate."""
    ledger: Ledger
    chunk: Chunk
    joins_previous: bool


class Planning:
    """The planning queries. Each method is one statement unless it says otherwise."""

    def __init__(self, engine: Engine):
        self.engine = engine

    def _rows(self, sql: str, conn: Connection | None = None, **params):
        if conn is not None:
            return conn.execute(text(sql), params).all()
        with self.engine.connect() as c:
            return c.execute(text(sql), params).all()

    # ------------------------------------------------------------------------------------ offload by size
    def size_topics(self, topic_name: str | None = None) -> list[SizeTopic]:
        """Topics with a threshold (>= 0) and at least one SEALED non-empty ledger (partial index
        ledger_sealed_by_topic), with their OPEN ledger if any; a topic without a limit costs nothing."""
        rows = self._rows("""
            SELECT t.topic_id, t.name, o.ledger_id AS open_ledger_id
            FROM tiering.topic t
            LEFT JOIN tiering.ledger o ON o.topic_id = t.topic_id AND o.state = 'OPEN'
            WHERE t.offload_threshold_bytes >= 0 AND (CAST(:name AS text) IS NULL OR t.name = :name)
              AND EXISTS (SELECT 1 FROM tiering.ledger s
                          WHERE s.topic_id = t.topic_id AND s.state = 'SEALED' AND s.entry_count > 0)
            ORDER BY t.name""", name=topic_name)
        return [SizeTopic(r.topic_id, r.name, r.open_ledger_id) for r in rows]

    def offload_by_size(self, topics: Sequence[SizeTopic], open_sizes: dict[tuple[int, int], int],
                        ) -> list[Ledger]:
        """policy.offload_by_size for each topic: the suffix sum of live sizes (newest first, the OPEN
        ledger's live size from `open_sizes` keyed (topic_id, ledger_id)) from the topic's oldest offloadable
        ledger on; the offloadable ledgers where it exceeds the threshold. Ordered by topic name, ledger."""
        if not topics:
            return []
        keys = list(open_sizes)
        rows = self._rows(f"""
            WITH cand AS (
                SELECT t.topic_id, t.name, t.offload_threshold_bytes AS threshold,
                       (SELECT min(s.ledger_id) FROM tiering.ledger s
                        WHERE s.topic_id = t.topic_id AND s.state = 'SEALED' AND s.entry_count > 0) AS first
                FROM tiering.topic t
                WHERE t.topic_id = ANY(CAST(:topic_ids AS bigint[])) AND t.offload_threshold_bytes >= 0
            ), opens AS (
                SELECT * FROM unnest(CAST(:o_topic AS bigint[]), CAST(:o_ledger AS bigint[]),
                                     CAST(:o_size AS bigint[])) AS o (topic_id, ledger_id, size)
            ), walk AS (
                SELECT l.*, c.name, c.threshold,
                       sum(CASE WHEN l.state = 'OPEN' THEN COALESCE(o.size, l.size_bytes) ELSE l.size_bytes END)
                           OVER (PARTITION BY l.topic_id ORDER BY l.ledger_id DESC) AS suffix
                FROM cand c
                JOIN tiering.ledger l ON l.topic_id = c.topic_id AND l.ledger_id >= c.first AND l.state <> 'DELETED'
                LEFT JOIN opens o ON o.topic_id = l.topic_id AND o.ledger_id = l.ledger_id
            )
            SELECT {_LEDGER_COLS} FROM walk l
            WHERE l.state = 'SEALED' AND l.entry_count > 0 AND l.suffix > l.threshold
            ORDER BY name, l.ledger_id""",
            topic_ids=[t.topic_id for t in topics], o_topic=[k[0] for k in keys], o_ledger=[k[1] for k in keys],
            o_size=[open_sizes[k] for k in keys])
        return [_ledger(r) for r in rows]

    # ------------------------------------------------------------------------------- offload: the run's end
    def unfinished_offloads(self, planned: Sequence[tuple[str, int]]) -> list[tuple[Ledger, bool]]:
        """Of the (topic name, ledger id) pairs a run planned, the non-empty ones still SEALED or OFFLOADING,
        each with whether its attempt's worker is gone (an OFFLOADING row nobody holds the lock of:
        metadata/attempt_locks.py; False for SEALED). One statement in a transaction of its own, whose
        lock checks end with it. The run's end reads what it planned, nothing else."""
        if not planned:
            return []
        with self.engine.begin() as conn:
            rows = conn.execute(text(f"""
                SELECT {_LEDGER_COLS},
                       CASE WHEN l.state = 'OFFLOADING'
                            THEN pg_try_advisory_xact_lock({OFFLOAD_CLASS}, hashtext(l.offload_uuid::text))
                            ELSE false END AS holder_gone
                FROM unnest(CAST(:names AS text[]), CAST(:ids AS bigint[])) AS p (name, ledger_id)
                JOIN tiering.topic t USING (name)
                JOIN tiering.ledger l ON l.topic_id = t.topic_id AND l.ledger_id = p.ledger_id
                WHERE l.state IN ('SEALED', 'OFFLOADING') AND l.entry_count > 0
                ORDER BY name, l.ledger_id"""),
                {"names": [p[0] for p in planned], "ids": [p[1] for p in planned]}).all()
        return [(_ledger(r), bool(r.holder_gone)) for r in rows]

    def entry_counts(self, pairs: Sequence[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The entry count of each (topic name, ledger id) pair that has a row (one statement): what a run
        moved, for its lineage (tiering.jobs.runner)."""
        if not pairs:
            return {}
        rows = self._rows("""
            SELECT p.name, p.ledger_id, l.entry_count
            FROM unnest(CAST(:names AS text[]), CAST(:ids AS bigint[])) AS p (name, ledger_id)
            JOIN tiering.topic t ON t.name = p.name
            JOIN tiering.ledger l ON l.topic_id = t.topic_id AND l.ledger_id = p.ledger_id""",
                          names=[p[0] for p in pairs], ids=[p[1] for p in pairs])
        return {(r.name, r.ledger_id): r.entry_count for r in rows}

    # -------------------------------------------------------------------------------------- delete-lagged
    def lagged_copies(self, topic_name: str | None = None, now: datetime | None = None) -> list[Ledger]:
        """policy.lagged_copies for every topic (partial index ledger_lagged_copies: copies still in tier 1,
        the tail), then DELETED ledgers whose tier-1 copy is left (ledger_deleted_with_copy)."""
        rows = self._rows(f"""
            SELECT * FROM (
                SELECT {_LEDGER_COLS}, 0 AS part FROM tiering.ledger l
                JOIN tiering.topic t ON t.topic_id = l.topic_id
                WHERE l.state = 'OFFLOADED' AND l.tier1_present
                  AND l.offloaded_at <= {_NOW} - make_interval(secs => t.deletion_lag_seconds)
                  AND (CAST(:name AS text) IS NULL OR t.name = :name)
                UNION ALL
                SELECT {_LEDGER_COLS}, 1 AS part FROM tiering.ledger l
                JOIN tiering.topic t ON t.topic_id = l.topic_id
                WHERE l.state = 'DELETED' AND l.tier1_present AND (CAST(:name AS text) IS NULL OR t.name = :name)
            ) x ORDER BY name, part, ledger_id""", name=topic_name, now=now)
        return [_ledger(r) for r in rows]

    def tier1_present(self, pairs: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """Which (topic, ledger) pairs metadata says still have a tier-1 copy (one statement)."""
        if not pairs:
            return set()
        rows = self._rows("""
            SELECT p.name, p.ledger_id FROM unnest(CAST(:names AS text[]), CAST(:ids AS bigint[])) AS p (name, ledger_id)
            JOIN tiering.topic t ON t.name = p.name
            JOIN tiering.ledger l ON l.topic_id = t.topic_id AND l.ledger_id = p.ledger_id
            WHERE l.tier1_present""", names=[p[0] for p in pairs], ids=[p[1] for p in pairs])
        return {(r.name, r.ledger_id) for r in rows}

    # ------------------------------------------------------------------------------------------ retention
    def retention(self, topic_name: str | None = None, now: datetime | None = None) -> dict[str, list[Ledger]]:
        """retention_plan without the reasons."""
        return {name: [led for led, _ in plan] for name, plan in self.retention_plan(topic_name, now).items()}

    def retention_plan(self, topic_name: str | None = None, now: datetime | None = None,
                       conn: Connection | None = None, hold: bool = True) -> dict[str, list[tuple[Ledger, str]]]:
        """policy.retention_plan for every topic with a limit or a ceiling: a recursive walk from the oldest
        live ledger (partial index ledger_live_by_topic), one index step per doomed ledger, stopping at the
        first to keep; the topic's live bytes come from topic_usage; a topic retaining unread data is held at
        its slowest ACTIVE subscription (one probe of index subscription_slowest, expired ones skipped).
        Topics without a limit are not read. `hold=False`: as if no subscription held anything back (what
        a dry run compares with). `conn`: inside the caller's transaction (retention's, under its locks)."""
        sql = f"""
            WITH RECURSIVE lim AS (
                SELECT t.topic_id, t.name, t.retention_bytes AS rb, t.max_retention_bytes AS cb,
                       COALESCE(u.live_bytes, 0) AS total,
                       CASE WHEN t.retention_seconds >= 0
                            THEN {_NOW} - make_interval(secs => t.retention_seconds) END AS cutoff,
                       CASE WHEN t.max_retention_seconds >= 0
                            THEN {_NOW} - make_interval(secs => t.max_retention_seconds) END AS ccut,
                       h.held, h.hl, h.he
                FROM tiering.topic t LEFT JOIN tiering.topic_usage u ON u.topic_id = t.topic_id
                LEFT JOIN LATERAL (
                    SELECT true AS held, s.ack_ledger_id AS hl, s.ack_entry_id AS he FROM tiering.subscription s
                    WHERE s.topic_id = t.topic_id AND t.retain_unread AND CAST(:hold AS boolean)
                      AND {_ACTIVE}
                    ORDER BY s.ack_ledger_id NULLS FIRST, s.ack_entry_id NULLS FIRST LIMIT 1) h ON true
                WHERE (t.retention_seconds >= 0 OR t.retention_bytes >= 0 OR t.max_retention_seconds >= 0
                       OR t.max_retention_bytes >= 0)
                  AND (CAST(:name AS text) IS NULL OR t.name = :name)
            ), walk AS (
                SELECT lim.name, lim.rb, lim.cb, lim.cutoff, lim.ccut, lim.held, lim.hl, lim.he,
                       lim.total - l.size_bytes AS rest, l.*
                FROM lim CROSS JOIN LATERAL (
                    SELECT * FROM tiering.ledger f WHERE f.topic_id = lim.topic_id AND f.state <> 'DELETED'
                    ORDER BY f.ledger_id LIMIT 1) l
                WHERE l.state IN ('SEALED', 'OFFLOADING', 'OFFLOADED') AND {_GOES.format(w="lim", rest="lim.total - l.size_bytes")}
                UNION ALL
                SELECT w.name, w.rb, w.cb, w.cutoff, w.ccut, w.held, w.hl, w.he, w.rest - l.size_bytes, l.*
                FROM walk w CROSS JOIN LATERAL (
                    SELECT * FROM tiering.ledger f
                    WHERE f.topic_id = w.topic_id AND f.state <> 'DELETED' AND f.ledger_id > w.ledger_id
                    ORDER BY f.ledger_id LIMIT 1) l
                WHERE l.state IN ('SEALED', 'OFFLOADING', 'OFFLOADED') AND {_GOES.format(w="w", rest="w.rest - l.size_bytes")}
            )
            SELECT {_LEDGER_COLS},
                   CASE WHEN {_READ} AND COALESCE(l.sealed_at <= l.cutoff, false) THEN 'time'
                        WHEN {_READ} AND l.rb >= 0 AND l.rest >= l.rb THEN 'size'
                        WHEN COALESCE(l.sealed_at <= l.ccut, false) THEN 'ceiling-time'
                        ELSE 'ceiling-size' END AS reason
            FROM walk l ORDER BY name, l.ledger_id"""
        rows = self._rows(sql, conn=conn, name=topic_name, now=now, hold=hold)
        out: dict[str, list[tuple[Ledger, str]]] = {}
        for r in rows:
            out.setdefault(r.name, []).append((_ledger(r), r.reason))
        return out

    def retention_housekeeping(self, topic_name: str | None = None) -> list[str]:
        """Topics retention must visit although nothing is due: a DELETED ledger whose tier-1 copy is left
        (a run killed after its commit), or a trim point (last DELETED ledger + 1, partial index
        ledger_deleted_by_topic, one probe per topic) beyond the marker last written to tier 2."""
        rows = self._rows("""
            SELECT t.name FROM tiering.topic t
            WHERE (CAST(:name AS text) IS NULL OR t.name = :name)
              AND (EXISTS (SELECT 1 FROM tiering.ledger l
                           WHERE l.topic_id = t.topic_id AND l.state = 'DELETED' AND l.tier1_present)
                   OR (SELECT max(d.ledger_id) FROM tiering.ledger d
                       WHERE d.topic_id = t.topic_id AND d.state = 'DELETED') + 1 > t.trim_marker_written)
            ORDER BY t.name""", name=topic_name)
        return [r.name for r in rows]

    def trim_point(self, topic_name: str) -> tuple[int, int]:
        """(the topic's trim point: last DELETED ledger + 1, or -1; the marker last written to tier 2)."""
        row = self._rows("""
            SELECT COALESCE((SELECT max(d.ledger_id) + 1 FROM tiering.ledger d
                             WHERE d.topic_id = t.topic_id AND d.state = 'DELETED'), -1) AS point,
                   t.trim_marker_written
            FROM tiering.topic t WHERE t.name = :name""", name=topic_name)
        return (row[0].point, row[0].trim_marker_written) if row else (-1, -1)

    def marker_lock(self, topic_name: str):
        """Held around reading a topic's trim marker in tier 2 and writing it: the marker is read, compared
        and PUT, so two runs doing that at once (retention by Airflow and by hand, truncate, topic delete) let
        the lower PUT land last and move it back; metadata then records the higher one as written, and no run
        rewrites it. Waits while another run holds it (a GET and a PUT)."""
        return session_lock(self.engine, MARKER_CLASS, func.hashtext(literal(topic_name)), wait=True)

    def record_trim_marker(self, topic_name: str, point: int) -> None:
        """The marker at `point` is in tier 2. Only ever moves forward (greatest), so two runs recording in
        any order leave the larger; not a policy change, so the topic's version is left alone."""
        with self.engine.begin() as conn:
            conn.execute(text("""UPDATE tiering.topic SET trim_marker_written = greatest(trim_marker_written, :p)
                                 WHERE name = :name AND trim_marker_written < :p"""), {"p": point, "name": topic_name})

    def deleted_with_copy(self, topic_name: str) -> list[Ledger]:
        """The topic's DELETED ledgers whose tier-1 copy is left (partial index ledger_deleted_with_copy)."""
        rows = self._rows(f"""
            SELECT {_LEDGER_COLS} FROM tiering.ledger l JOIN tiering.topic t ON t.topic_id = l.topic_id
            WHERE t.name = :name AND l.state = 'DELETED' AND l.tier1_present ORDER BY l.ledger_id""",
                          name=topic_name)
        return [_ledger(r) for r in rows]

    def truncate_before(self, topic_id: int, name: str, before_ledger: int,
                        conn: Connection | None = None) -> tuple[int | None, list[Ledger]]:
        """(the topic's last ledger id or None, its SEALED/OFFLOADING/OFFLOADED ledgers below `before_ledger`), read on
        the live-ledger index rather than the topic's DELETED history (in `conn`'s transaction if given)."""
        rows = self._rows(f"""
            SELECT {_LEDGER_COLS}, (SELECT max(m.ledger_id) FROM tiering.ledger m WHERE m.topic_id = :tid) AS last
            FROM (SELECT CAST(:name AS text) AS name) n
            LEFT JOIN tiering.ledger l ON l.topic_id = :tid AND l.state <> 'DELETED' AND l.ledger_id < :before
                                      AND l.state IN ('SEALED', 'OFFLOADING', 'OFFLOADED')
            ORDER BY l.ledger_id""", conn=conn, tid=topic_id, name=name, before=before_ledger)
        last = rows[0].last if rows else None
        return last, [_ledger(r) for r in rows if r.ledger_id is not None]

    # --------------------------------------------------------------------------------------------- defrag
    def defrag_candidates(self, small_bytes: int, topic_name: str | None = None) -> list[DefragCandidate]:
        """OFFLOADED ledgers (not marked lost) whose chunk is shorter than `small_bytes` and alone in its data object (partial
        index chunk_defrag_candidates on the maintained chunk.data_alone, re-checked on chunk_data_key), each
        with whether it continues the previous candidate's run (one backward probe of ledger_live_by_topic)."""
        rows = self._rows(f"""
            WITH cand AS (
                SELECT c.topic_id AS c_topic, c.ledger_id AS c_ledger, c.data_key, c.data_offset, c.data_length, c.index_key,
                       c.index_offset, c.index_length, c.first_entry_id, c.last_entry_id, c.version AS chunk_version,
                       c.data_etag, c.index_etag
                FROM tiering.chunk c
                WHERE c.data_alone AND c.data_length < :small
                  AND NOT EXISTS (SELECT 1 FROM tiering.chunk o WHERE o.data_key = c.data_key
                                  AND (o.topic_id, o.ledger_id) <> (c.topic_id, c.ledger_id))
            ), full_cand AS (
                SELECT cand.*, t.name, l.*,
                       (SELECT max(p.ledger_id) FROM tiering.ledger p
                        WHERE p.topic_id = cand.c_topic AND p.ledger_id < cand.c_ledger AND p.state <> 'DELETED'
                          AND NOT (p.state = 'SEALED' AND p.entry_count = 0)) AS prev_kept
                FROM cand JOIN tiering.topic t ON t.topic_id = cand.c_topic
                JOIN tiering.ledger l ON l.topic_id = cand.c_topic AND l.ledger_id = cand.c_ledger
                WHERE l.state = 'OFFLOADED' AND l.lost_at IS NULL  -- a lost ledger's objects are no source
                  AND (CAST(:name AS text) IS NULL OR t.name = :name)
            )
            SELECT {_LEDGER_COLS}, l.data_key, l.data_offset, l.data_length, l.index_key, l.index_offset,
                   l.index_length, l.first_entry_id, l.last_entry_id, l.chunk_version, l.data_etag, l.index_etag,
                   l.prev_kept,
                   lag(l.ledger_id) OVER (PARTITION BY l.topic_id ORDER BY l.ledger_id) AS prev_cand
            FROM full_cand l ORDER BY name, l.ledger_id""", small=small_bytes, name=topic_name)
        return [DefragCandidate(_ledger(r), Chunk(r.data_key, r.data_offset, r.data_length, r.index_key,
                                                  r.index_offset, r.index_length, r.first_entry_id,
                                                  r.last_entry_id, r.chunk_version, r.data_etag, r.index_etag),
                                r.prev_cand is not None and r.prev_kept == r.prev_cand) for r in rows]
