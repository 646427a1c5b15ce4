"""The set-based planners (tiering/metadata/planning.py) return exactly what the pure policy functions
(tiering/policy.py, the specification) return on the same rows: random metadata (seeded) with topics of
random policies, ledgers in every state, chunks sharing data objects, written into PostgreSQL with the
product's triggers on; then each planner is compared with its policy function over every topic."""
from __future__ import annotations

import random
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text

from tiering import policy
from tiering.errors import BadInput
from tiering.metadata.repository import MetadataStore
from tiering.model import LedgerState, Position, TopicPolicy

S = LedgerState
SMALL, MAX_MERGED = 100, 400


def _insert_world(engine, seed: int, now, topics: int = 12) -> None:
    """Times are `now` minus ages drawn from the policies' own values and sizes from multiples of 100, so
    the boundaries (age == lag, sum == threshold) occur and a < for <= in a query fails a test."""
    rnd = random.Random(seed)
    ages = [0, 3600, 14400, 86400, 2 * 86400]

    def ago():
        return now - timedelta(seconds=rnd.choice(ages + [rnd.randint(0, 10 * 86400)]))
    topic_rows, ledger_rows, chunk_rows = [], [], []
    for k in range(topics):
        name = f"t{seed}-{k}"
        topic_rows.append({
            "name": name,
            "oab": rnd.choice([-1, 0, 3600, 86400]),
            "thr": rnd.choice([-1, -1, 0, 100 * rnd.randint(0, 30)]),
            "lag": rnd.choice(ages[:4]),
            "rs": rnd.choice([-1, -1] + ages),
            "rb": rnd.choice([-1, -1, 100 * rnd.randint(0, 60)]),
        })
        n = rnd.randint(0, 30)
        obj, obj_left = None, 0
        for lid in range(n):
            last = lid == n - 1
            state = rnd.choices(["OPEN", "SEALED", "OFFLOADING", "OFFLOADED", "DELETED"],
                                [3 if last else 0, 3, 1, 6, 3])[0]
            sealed = None if state == "OPEN" else ago()
            entries = rnd.choice([0, 1, 5]) if state in ("SEALED", "OPEN") else rnd.randint(0, 5)
            if state in ("OFFLOADING", "OFFLOADED"):
                entries = max(entries, 1)
            size = 0 if entries == 0 else rnd.choice([0, 100, 200, 300, 500])
            present = True if state not in ("OFFLOADED", "DELETED") else rnd.random() < 0.5
            row = {"name": name, "lid": lid, "state": state, "entries": entries, "size": size,
                   "sealed": sealed, "present": present,
                   "uuid": str(uuid.UUID(int=rnd.getrandbits(128))) if state in ("OFFLOADING", "OFFLOADED") else None,
                   "started": ago() if state == "OFFLOADING" else None,
                   "offloaded": ago() if state == "OFFLOADED" else None,
                   "deleted": now if state == "DELETED" else None}
            ledger_rows.append(row)
            if state == "OFFLOADED":
                # objects shared by a few consecutive offloaded ledgers (batches, merges) or alone
                if obj_left <= 0 or rnd.random() < 0.5:
                    obj, obj_left = f"{name}/obj{lid}", rnd.choice([1, 1, 2, 3])
                obj_left -= 1
                chunk_rows.append({"name": name, "lid": lid, "key": obj,
                                   "len": rnd.choice([1, SMALL // 2, SMALL - 1, SMALL, 2 * SMALL])})
        live = [r["size"] for r in ledger_rows if r["name"] == name and r["state"] != "DELETED"]
        if live and rnd.random() < 0.3:  # the size limit exactly at the first live ledger's boundary
            topic_rows[-1]["rb"] = sum(live) - live[0]
    with engine.begin() as conn:
        for t in topic_rows:
            conn.execute(text(
                "INSERT INTO tiering.topic (name, offload_after_seconds, offload_threshold_bytes, "
                "deletion_lag_seconds, retention_seconds, retention_bytes) VALUES (:name, :oab, :thr, :lag, :rs, :rb)"),
                t)
        for r in ledger_rows:
            conn.execute(text(
                "INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, sealed_at, "
                "tier1_present, tier1_deleted_at, offload_uuid, offload_started_at, offloaded_at, deleted_at) "
                "SELECT topic_id, :lid, CAST(:state AS tiering.ledger_state), :entries, :size, "
                ":sealed, :present, CASE WHEN :present THEN NULL ELSE now() END, "
                "CAST(:uuid AS uuid), :started, :offloaded, :deleted FROM tiering.topic WHERE name = :name"), r)
        for c in chunk_rows:
            conn.execute(text(
                "INSERT INTO tiering.chunk (topic_id, ledger_id, data_key, data_offset, data_length, index_key, "
                "index_offset, index_length, first_entry_id, last_entry_id) SELECT topic_id, :lid, :key, 0, :len, "
                ":key || '-index', 0, 10, 0, 0 FROM tiering.topic WHERE name = :name"), c)
    if rnd.random() < 0.5:  # some chunks deleted afterwards: remnants of shared objects become alone
        with engine.begin() as conn:
            conn.execute(text(
                "UPDATE tiering.ledger SET state = 'DELETED', deleted_at = now(), version = version + 1 "
                "WHERE (topic_id, ledger_id) IN (SELECT topic_id, ledger_id FROM tiering.chunk "
                "WHERE ledger_id % 4 = 1)"))
            conn.execute(text("DELETE FROM tiering.chunk WHERE ledger_id % 4 = 1"))


SEEDS = list(range(12))


@pytest.fixture
def meta(db):
    return MetadataStore(db)


def _world(meta, seed):
    now = meta.now()
    _insert_world(meta.engine, seed, now)
    topics = meta.list_topics()
    return now, topics, {t.name: meta.list_ledgers(t.name) for t in topics}


@pytest.mark.parametrize("seed", SEEDS)
def test_offload_by_size_equals_policy(meta, seed):
    now, topics, ledgers = _world(meta, seed)
    rnd = random.Random(seed)
    size_topics = meta.planning.size_topics()
    open_sizes = {(t.topic_id, t.open_ledger_id): 100 * rnd.randint(0, 30)
                  for t in size_topics if t.open_ledger_id is not None and rnd.random() < 0.7}
    expected = []
    for t in topics:
        opens = {lid: size for (tid, lid), size in open_sizes.items() if tid == t.topic_id}
        expected += policy.offload_by_size(ledgers[t.name], t.policy, opens)
    assert meta.planning.offload_by_size(size_topics, open_sizes) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_lagged_copies_equal_policy(meta, seed):
    now, topics, ledgers = _world(meta, seed)
    expected = []
    for t in topics:
        expected += policy.lagged_copies(ledgers[t.name], t.policy, now)
        expected += [led for led in ledgers[t.name] if led.state == S.DELETED and led.tier1_present]
    got = meta.planning.lagged_copies(now=now)
    assert got == expected
    one = topics[0].name
    assert meta.planning.lagged_copies(one, now=now) == [led for led in expected if led.topic == one]


@pytest.mark.parametrize("seed", SEEDS)
def test_retention_equals_policy(meta, seed):
    now, topics, ledgers = _world(meta, seed)
    expected = {t.name: policy.retention(ledgers[t.name], t.policy, now) for t in topics}
    expected = {k: v for k, v in expected.items() if v}
    assert meta.planning.retention(now=now) == expected


@pytest.mark.parametrize("seed", SEEDS)
def test_defrag_candidates_equal_policy(meta, seed):
    _, topics, ledgers = _world(meta, seed)
    expected = []
    for t in topics:
        expected += policy.defrag_groups(ledgers[t.name], meta.chunks(t.name), SMALL, MAX_MERGED)
    cands = meta.planning.defrag_candidates(SMALL)
    got = policy.defrag_runs([(c.ledger, c.chunk, c.joins_previous) for c in cands], MAX_MERGED)
    assert got == expected


@pytest.mark.parametrize("seed", SEEDS[:6])
def test_truncate_equals_policy(meta, seed):
    _, topics, ledgers = _world(meta, seed)
    rnd = random.Random(seed)
    for t in topics:
        pos = rnd.randint(0, len(ledgers[t.name]) + 1)
        last, got = meta.planning.truncate_before(t.topic_id, t.name, pos)
        try:
            expected = policy.truncate_before(ledgers[t.name], Position(pos, 0))
        except BadInput:
            assert last is None or pos > last
            continue
        assert got == expected


def test_the_worlds_give_every_planner_work(meta):
    """The comparisons above are not vacuous: in most worlds each policy function selects something."""
    from tests.conftest import empty_tables

    work = {"size": 0, "lagged": 0, "retention": 0, "defrag": 0}
    for seed in SEEDS:
        empty_tables(meta.engine)
        now, topics, ledgers = _world(meta, seed)
        for t in topics:
            leds = ledgers[t.name]
            work["size"] += bool(policy.offload_by_size(leds, t.policy))
            work["lagged"] += bool(policy.lagged_copies(leds, t.policy, now))
            work["retention"] += bool(policy.retention(leds, t.policy, now))
            work["defrag"] += bool(policy.defrag_groups(leds, meta.chunks(t.name), SMALL, MAX_MERGED))
    assert min(work.values()) >= len(SEEDS), work


def test_data_alone_follows_inserts_deletes_and_defrag_switches(meta):
    """The maintained flag defrag's index reads: a batch's chunks are not alone; deleting all but one makes
    the last alone; switching chunks to one merged key makes them shared."""
    meta.create_topic("flag")
    with meta.engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO tiering.ledger (topic_id, ledger_id, state, entry_count, size_bytes, sealed_at, "
            "offload_uuid, offloaded_at) SELECT topic_id, i, 'OFFLOADED', 1, 10, now(), gen_random_uuid(), now() "
            "FROM tiering.topic, generate_series(0, 3) i WHERE name = 'flag'"))
        conn.execute(text(
            "INSERT INTO tiering.chunk (topic_id, ledger_id, data_key, data_offset, data_length, index_key, "
            "index_offset, index_length, first_entry_id, last_entry_id) SELECT topic_id, i, "
            "CASE WHEN i < 3 THEN 'batch' ELSE 'lone' END, 0, 10, 'ix', 0, 5, 0, 0 "
            "FROM tiering.topic, generate_series(0, 3) i WHERE name = 'flag'"))

    def alone():
        with meta.engine.connect() as conn:
            return dict(conn.execute(text("SELECT ledger_id, data_alone FROM tiering.chunk ORDER BY 1")).all())

    assert alone() == {0: False, 1: False, 2: False, 3: True}
    led = {x.ledger_id: x for x in meta.list_ledgers("flag")}
    meta.delete_ledgers([led[0], led[1]], "test", timedelta(0))
    assert alone() == {2: True, 3: True}
    with meta.engine.begin() as conn:
        conn.execute(text("UPDATE tiering.chunk SET data_key = 'merged', version = version + 1"))
    assert alone() == {2: False, 3: False}
    assert meta.planning.defrag_candidates(SMALL) == []


def test_unknown_topic_names_fail_before_planning(deps):
    from tiering.errors import TopicNotFound
    from tiering.ops.defrag import plan_defrag
    from tiering.ops.delete_lagged import plan_delete_lagged
    from tiering.ops.offload import plan_offload
    from tiering.ops.retention import plan_retention

    for plan in (lambda: plan_offload(deps, "size", "nope"), lambda: plan_delete_lagged(deps, "nope"),
                 lambda: plan_retention(deps, "nope"), lambda: plan_defrag(deps, "nope")):
        with pytest.raises(TopicNotFound):
            plan()


def test_policy_defaults_give_no_work(meta):
    meta.create_topic("quiet", TopicPolicy())
    assert meta.planning.retention() == {} and meta.planning.size_topics() == []


def _subscribe(engine, seed: int, now, topics, ledgers) -> dict[str, list]:
    """Random readers on the random world: policies retaining unread data, ceilings, expiries, and positions
    anywhere (none yet, inside any ledger, on a ledger's last entry, behind the head); returns the positions
    of the ACTIVE ones per topic, by the rule the SQL uses (model.Subscription.state)."""
    rnd = random.Random(seed * 7919)
    holders: dict[str, list] = {}
    with engine.begin() as conn:
        for t in topics:
            rs, rb = t.policy.retention_seconds, t.policy.retention_bytes
            ms = rnd.choice([-1, -1, max(rs, 0) + rnd.choice([0, 3600, 86400])])
            mb = rnd.choice([-1, -1, max(rb, 0) + 100 * rnd.randint(0, 20)])
            expiry = rnd.choice([-1, -1, 3600, 86400])
            conn.execute(text("UPDATE tiering.topic SET retain_unread = :ru, max_retention_seconds = :ms, "
                              "max_retention_bytes = :mb, subscription_expiry_seconds = :ex WHERE topic_id = :tid"),
                         {"ru": rnd.random() < 0.7, "ms": ms, "mb": mb, "ex": expiry, "tid": t.topic_id})
            for k in range(rnd.choice([0, 1, 1, 2, 4])):
                leds = ledgers[t.name]
                pos = None
                if leds and rnd.random() < 0.8:
                    led = rnd.choice(leds)
                    entry = rnd.choice([0, max(led.entry_count - 1, 0), rnd.randint(0, max(led.entry_count - 1, 0))])
                    pos = Position(led.ledger_id, entry)
                created = now - timedelta(seconds=rnd.choice([0, 3600, 86400, 2 * 86400]))
                acked = rnd.choice([None, now - timedelta(seconds=rnd.choice([0, 3600, 86400, 2 * 86400]))])
                conn.execute(text("INSERT INTO tiering.subscription (topic_id, name, ack_ledger_id, ack_entry_id, "
                                  "created_at, last_ack_at) VALUES (:tid, :n, :l, :e, :c, :a)"),
                             {"tid": t.topic_id, "n": f"s{k}", "l": pos and pos.ledger_id, "e": pos and pos.entry_id,
                              "c": created, "a": acked})
                seen = acked or created
                if expiry < 0 or seen > now - timedelta(seconds=expiry):
                    holders.setdefault(t.name, []).append(pos)
    return holders


@pytest.mark.parametrize("seed", SEEDS)
def test_retention_with_subscriptions_equals_policy(meta, seed):
    now, topics, ledgers = _world(meta, seed)
    holders = _subscribe(meta.engine, seed, now, topics, ledgers)
    topics = meta.list_topics()  # with the policies just set
    expected = {t.name: policy.retention_plan(ledgers[t.name], t.policy, now, holders.get(t.name, ()))
                for t in topics}
    assert meta.planning.retention_plan(now=now) == {k: v for k, v in expected.items() if v}
    unbound = {t.name: policy.retention_plan(ledgers[t.name], t.policy, now) for t in topics}
    assert meta.planning.retention_plan(now=now, hold=False) == {k: v for k, v in unbound.items() if v}
    # the subscriptions' backlog equals policy.backlog (sealed ledgers; open ones count 0 in metadata)
    for sub, b in meta.subs.with_backlog():
        assert (b.entries, b.bytes) == policy.backlog(sub.position, ledgers[sub.topic])
