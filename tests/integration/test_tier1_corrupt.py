"""An offloaded ledger whose tier-1 copy fails its checks while its tier-2 copy is sound (a flipped byte on
the local disk within the deletion lag): reads go on from tier 2 at the entry tier 1 could not give,
`verify` names that copy and says `repair` fixes it, and `repair` deletes it early; a ledger not offloaded
has no second copy and still fails. On PostgreSQL, RGW and tier-1 files."""
from __future__ import annotations

import os
import re

import pytest

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli, read_data  # noqa: F401 - the fixture
from tiering.errors import CorruptObjectError
from tiering.tier1 import frames
from tiering.model import LedgerState as S, Position, TopicPolicy
from tiering.ops.offload import offload_many
from tiering.read import ReadHandle
from tiering.tier2.reader import tier2_opener


def _flip(deps, topic: str, ledger_id: int, at: float = 0.5) -> None:
    """Flip one byte `at` of the way into the ledger's tier-1 file (its frames, for these sizes)."""
    path = deps.tier1.path(topic, ledger_id)
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.fixture
def world(deps):
    """Ledgers 0-2 offloaded with their tier-1 copies kept (within the lag), ledger 3 sealed only."""
    expected = produce(deps, "c", [entries(f"c{i}", 40, 100) for i in range(4)])
    report = offload_many(deps, [deps.meta.get_ledger("c", i) for i in range(3)])
    assert sorted(report.offloaded) == [0, 1, 2]
    return expected


def test_reads_go_on_from_tier2_where_an_offloaded_ledgers_tier1_copy_fails(deps, world, caplog):
    _flip(deps, "c", 1)
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    got = {(e.ledger_id, e.entry_id): e.data for e in handle.read("c")}
    assert got == world
    batches = {(b.ledger_id, b.first_entry_id + i): p for b in handle.read_batches("c")
               for i, p in enumerate(b.payloads.to_pylist())}
    assert batches == world
    assert "ledger c/1: its tier-1 copy fails its checks" in caplog.text
    # the file's header broken: the copy cannot even be opened, and the whole ledger comes from tier 2
    _flip(deps, "c", 2, at=0)
    assert {(e.ledger_id, e.entry_id): e.data for e in handle.read("c")} == world


def test_a_ledger_not_offloaded_has_no_second_copy(deps, world):
    _flip(deps, "c", 3)
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    with pytest.raises(CorruptObjectError, match="tier-1"):
        list(handle.read("c"))


def test_verify_names_the_copy_and_repair_deletes_it(cli, deps, world):  # noqa: F811
    _flip(deps, "c", 1)
    read = cli("read", "c", "--json")  # the command reads around it too, and says so on stderr
    assert read.returncode == 0 and read_data(read.json_lines) == world
    [warned] = read.stderr.splitlines()
    assert re.fullmatch(r"tiering: warning: ledger c/1: its tier-1 copy fails its checks \(corrupt tier-1 ledger "
                        r"entry at .*\); reading it from tier 2 from entry \d+", warned), warned
    bad = cli("verify", "c", "--json")
    assert bad.returncode == 1
    [problem] = bad.json["problems"]
    assert problem.startswith("ledger 1: tier-1 copy: corrupt tier-1 ledger entry at ") and \
        "reads use the verified tier-2 copy; `tiering repair` deletes the corrupt tier-1 copy" in problem, problem
    assert bad.json["repairable_count"] == 1 and bad.json["unrepairable_count"] == 0
    assert bad.json["entry_count"] == 160  # the ledger is counted: its tier-2 copy was read whole

    dry = cli("repair", "--topic", "c", "--dry-run", "--json").ok().json
    assert [(p["ledger"], p["repair"]) for p in dry["problems"]] == [(1, "delete the tier-1 copy")]
    assert deps.tier1.exists("c", 1)

    done = cli("repair", "--topic", "c", "--json").ok().json
    assert done["repaired_count"] == 1 and done["lost_count"] == 0
    led = deps.meta.get_ledger("c", 1)
    assert (led.state, led.tier1_present, deps.tier1.exists("c", 1)) == (S.OFFLOADED, False, False)
    assert cli("verify", "c", "--json").ok().json["ok"] is True
    assert read_data(cli("read", "c", "--json")) == world
    # the other ledgers' copies stay for delete-lagged, and a second run finds nothing
    assert all(deps.meta.get_ledger("c", i).tier1_present for i in (0, 2, 3))
    assert cli("repair", "--topic", "c", "--json").ok().json["problem_count"] == 0


def test_both_copies_corrupt_is_not_repairable(cli, deps, world, s3_client):  # noqa: F811
    _flip(deps, "c", 1)
    ch = deps.meta.get_chunk(deps.meta.get_ledger("c", 1))
    body = bytearray(s3_client.get_object(Bucket=deps.bucket.name, Key=ch.data_key)["Body"].read())
    body[ch.data_offset + ch.data_length // 2] ^= 0xFF
    s3_client.put_object(Bucket=deps.bucket.name, Key=ch.data_key, Body=bytes(body))
    bad = cli("verify", "c", "--json")
    assert bad.returncode == 1
    [problem] = bad.json["problems"]
    assert problem.startswith("ledger 1: tier-1 copy: corrupt") and "; tier-2 copy: corrupt page" in problem and \
        problem.endswith("(not repairable: no verified copy in another tier)"), problem
    assert bad.json["repairable_count"] == 0
    # a reader gets the error, never bytes from either copy past the break
    assert "corrupt" in cli("read", "c", "--from", "1:0", "--to", "1:39").one_line_error(1)


def _swap_in(deps, topic: str, ledger_id: int, other: tuple[str, int]) -> None:
    """Put another ledger's whole, valid tier-1 file where the ledger's copy is (every frame's CRC holds)."""
    deps.tier1.path(topic, ledger_id).write_bytes(deps.tier1.path(*other).read_bytes())


def test_another_ledgers_file_in_a_copys_place_is_never_read_nor_offloaded(cli, deps, world):  # noqa: F811
    # another topic's copy holding fewer entries than the row (30), and the copy of a ledger of the same topic
    # holding as many entries and bytes as the row (40 x 100), each entry sound: neither is the ledger's
    produce(deps, "other", [entries("o30-", 30, 100)])
    _swap_in(deps, "c", 0, ("other", 0))
    _swap_in(deps, "c", 1, ("c", 2))
    handle = ReadHandle(deps.meta, deps.tier1, tier2_opener(deps.bucket))
    assert {(e.ledger_id, e.entry_id): e.data for e in handle.read("c")} == world  # both from tier 2
    read = cli("read", "c", "--json")
    assert read.returncode == 0 and read_data(read.json_lines) == world
    assert [line.split(": its")[0] for line in read.stderr.splitlines()] == ["tiering: warning: ledger c/0",
                                                                             "tiering: warning: ledger c/1"]
    bad = cli("verify", "c", "--json")
    assert bad.returncode == 1 and bad.json["repairable_count"] == 2 and bad.json["unrepairable_count"] == 0
    assert all("belongs to another ledger" in p for p in bad.json["problems"]), bad.json["problems"]
    # a ledger not offloaded: no second copy, a failure (exit 1), never its entries nor "no such entry" (exit 2)
    _swap_in(deps, "c", 3, ("c", 2))
    with pytest.raises(CorruptObjectError, match="belongs to another ledger"):
        list(handle.read("c", start=Position(3, 0)))
    assert "belongs to another ledger" in cli("read", "c", "--from", "3:0").one_line_error(1)
    offloaded = cli("offload-prefix", "c", "--all-sealed", "--json")
    assert offloaded.returncode == 1 and offloaded.json["offloaded"] == []
    assert [f["ledger"] for f in offloaded.json["failed"]] == [3]
    assert "belongs to another ledger" in offloaded.json["failed"][0]["error"]
    assert deps.meta.get_ledger("c", 3).state == S.SEALED and deps.meta.get_chunk(deps.meta.get_ledger("c", 3)) is None


def _not_a_file(deps, topic: str, ledger_id: int, kind: str) -> None:
    path = deps.tier1.path(topic, ledger_id)
    path.unlink()
    os.mkfifo(path) if kind == "fifo" else path.mkdir()


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_fifo_or_directory_in_a_copys_place_is_a_broken_copy_never_a_hang(cli, deps, world, kind):  # noqa: F811
    _not_a_file(deps, "c", 1, kind)
    _not_a_file(deps, "c", 3, kind)  # not offloaded: no second copy
    read = cli("read", "c", "--to", "2:39", "--json")  # before: a FIFO blocked the read for ever
    assert read.returncode == 0 and read_data(read.json_lines) == {k: v for k, v in world.items() if k[0] < 3}
    assert read.stderr.startswith("tiering: warning: ledger c/1") and "not a regular file" in read.stderr
    line = cli("read", "c", "--from", "3:0").one_line_error(1)
    assert "not a regular file" in line and str(deps.tier1.path("c", 3)) in line
    offloaded = cli("offload-prefix", "c", "--all-sealed", "--json")
    assert offloaded.returncode == 1 and [f["ledger"] for f in offloaded.json["failed"]] == [3]
    # delete-lagged: the others' copies go, this one is kept and named, run after run (no tombstone left)
    deps.meta.set_policy("c", deps.meta.get_topic("c").version, TopicPolicy(deletion_lag_seconds=0))
    for _ in range(2):
        lagged = cli("delete-lagged", "--topic", "c", "--json")
        assert lagged.returncode == 1 and [f["ledger"] for f in lagged.json["failed"]] == [1], lagged.stdout
        assert "not a regular file" in lagged.json["failed"][0]["error"]
    assert deps.tier1.ledger_ids("c") == [1, 3] and deps.tier1.retired_ids("c") == []
    assert deps.tier1.path("c", 1).is_dir() == (kind == "directory")  # left as it was


def test_producing_into_an_open_ledger_whose_file_is_a_fifo_names_the_file(cli, deps):  # noqa: F811
    produce(deps, "p", [], open_tail=[b"x"])
    _not_a_file(deps, "p", 0, "fifo")
    line = cli("produce", "p", "--entries", "1", "--entry-size", "10").one_line_error(1)
    assert "not a regular file" in line and str(deps.tier1.path("p", 0)) in line


def test_a_damaged_entry_inside_the_open_ledger_stops_its_writers_until_an_operator_discards(cli, deps):  # noqa: F811
    """Before, the next produce or seal cut the ledger at the damaged entry (its recovery took it for a torn
    tail): the intact entries after it were gone with exit 0 and their positions handed out again."""
    expected = produce(deps, "o", [], open_tail=[bytes([i]) * 100 for i in range(10)])
    path = deps.tier1.path("o", 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside entry 3's frame
    path.write_bytes(bytes(data))
    for args in (("produce", "o", "--entries", "1", "--entry-size", "10"), ("seal", "o")):
        line = cli(*args).one_line_error(1)
        assert "is damaged and an intact later entry follows" in line and "--discard-damaged" in line
    assert path.read_bytes() == bytes(data)
    sealed = cli("seal", "o", "--discard-damaged", "--json")
    assert sealed.returncode == 0 and sealed.json["entry_count"] == 3 and sealed.json["discarded_bytes"] > 0
    assert read_data(cli("read", "o", "--json")) == {k: v for k, v in expected.items() if k[1] < 3}


def _damaged_open_ledger(deps, topic: str) -> dict:
    """An open ledger of 10 entries of 100 bytes whose entry 3 is damaged, intact ones after it."""
    expected = produce(deps, topic, [], open_tail=[bytes([i]) * 100 for i in range(10)])
    path = deps.tier1.path(topic, 0)
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01  # inside entry 3's frame
    path.write_bytes(bytes(data))
    return expected


def test_entries_a_discard_cuts_are_lost_to_each_subscription_that_had_not_read_them(cli, deps):  # noqa: F811
    """Before, `seal --discard-damaged` cut entries 3 to 9 with no record: a subscription at 0:1 went on at
    1:0 with nothing said, and one at 0:8 was left on an entry that no longer exists (an ack of it passed)."""
    _damaged_open_ledger(deps, "d")
    subs = deps.meta.subs
    subs.create("d", "behind", Position(0, 1))
    subs.create("d", "inside", Position(0, 8))
    subs.create("d", "fresh", None)
    sealed = cli("seal", "d", "--discard-damaged", "--json").ok().json
    assert sealed["entry_count"] == 3 and sealed["discarded_entries"] == {"from": 3, "to": 9}
    assert sealed["subscriptions_losing"] == [{"subscription": "behind", "entries": 7},
                                              {"subscription": "inside", "entries": 1},
                                              {"subscription": "fresh", "entries": 7}]
    now = {s.name: s for s in subs.of_topics(["d"])["d"]}
    assert now["behind"].position == Position(0, 1) and now["fresh"].position is None  # still to read 0:2, 0:0..
    assert now["inside"].position == Position(0, 2)  # an entry that exists: the last one kept
    assert [now[n].bytes_deleted_unread for n in ("behind", "inside", "fresh")] == [700, 100, 700]  # payload bytes
    assert {n: (s.entries_deleted_unread, s.last_loss_reason) for n, s in now.items()} == {
        n: (k, "ledger 0 sealed with --discard-damaged: entries 3 to 9 discarded")
        for n, k in (("behind", 7), ("inside", 1), ("fresh", 7))}
    assert "beyond the end of ledger 0" in cli("subscription", "ack", "d", "inside", "0:8").one_line_error(2)
    with deps.meta.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT from_ledger_id, from_entry_id, to_entry_id, entries FROM "
                                 "tiering.subscription_loss ORDER BY subscription_id")).all() == [
            (0, 3, 9, 7), (0, 9, 9, 1), (0, 3, 9, 7)]


def test_a_discard_killed_after_recording_its_losses_records_them_once(cli, deps):  # noqa: F811
    """The losses are recorded before the cut, with the discard itself (the ledger's attribute): a seal killed
    between the two, run again, cuts the file and records nothing twice."""
    _damaged_open_ledger(deps, "k")
    deps.meta.subs.create("k", "r", Position(0, 0))
    topic_id = deps.meta.get_topic("k").topic_id
    # what the killed run committed: the losses of entries 3 to 9, and no cut
    assert deps.meta.subs.record_discard("k", topic_id, 0, 3, 9, 700) == [("r", 7)]
    assert deps.meta.subs.record_discard("k", topic_id, 0, 3, 9, 700) is None  # once
    sealed = cli("seal", "k", "--discard-damaged", "--json").ok().json
    assert sealed["entry_count"] == 3 and sealed["subscriptions_losing"] == []
    [r] = deps.meta.subs.of_topics(["k"])["k"]
    assert (r.position, r.entries_deleted_unread) == (Position(0, 0), 7)


def test_copies_that_each_pass_their_checks_but_differ_are_not_called_repairable(cli, deps, world):  # noqa: F811
    """Before, verify called such a ledger repairable by re-making tier 2 from tier 1, while repair (which
    checks each copy on its own) found nothing to do: nothing tells which copy holds the ledger."""
    from tiering.tier1 import LedgerWriter

    path = deps.tier1.path("c", 2)
    path.unlink()
    with LedgerWriter(path) as other:  # its own identity, every CRC sound, the row's count and bytes
        for i in range(40):
            other.append(bytes([i]) * 100)
        other.seal()
    bad = cli("verify", "c", "--json")
    assert bad.returncode == 1 and (bad.json["repairable_count"], bad.json["unrepairable_count"]) == (0, 1)
    assert "which one holds the ledger cannot be told" in bad.json["problems"][0]
    assert cli("repair", "--topic", "c", "--json").returncode == 0


def _flip_at(path, offset: int) -> bytes:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))
    return bytes(data)


def test_the_open_ledgers_file_damaged_or_gone_is_said_and_leaves_the_sealed_ones_alone(cli, deps):  # noqa: F811
    expected = produce(deps, "q", [entries("q0", 3, 10)], open_tail=[bytes([i]) * 10 for i in range(20)])
    path = deps.tier1.path("q", 1)
    saved = path.read_bytes()
    # a frame header of the open ledger damaged, intact frames after it: said by read and verify, not hidden
    _flip_at(path, frames.HEADER_LEN[frames.VERSION] + 2)
    assert "is damaged and an intact later entry follows" in cli("read", "q", "--from", "1:0").one_line_error(1)
    assert cli("verify", "q").returncode == 1
    # a range that ends before the open ledger, and an offload of the sealed ones, need nothing of its file
    assert read_data(cli("read", "q", "--to", "0:2", "--json")) == {k: v for k, v in expected.items() if k[0] == 0}
    path.unlink()
    os.mkfifo(path)
    offloaded = cli("offload-prefix", "q", "--all-sealed", "--json")
    assert offloaded.returncode == 0 and [i["ledger"] for i in offloaded.json["offloaded"]] == [0]
    assert "not a regular file" in cli("read", "q", "--from", "1:0").one_line_error(1)
    # cut to nothing: the header its writer made durable before the row is gone, so are its entries
    path.unlink()
    path.write_bytes(b"")
    for args in (("produce", "q", "--entries", "1", "--entry-size", "5"), ("read", "q", "--from", "1:0")):
        assert "its header is gone" in cli(*args).one_line_error(1)
    path.write_bytes(saved)
    assert read_data(cli("read", "q", "--json")) == expected


def test_a_flipped_footer_index_entry_fails_verify_as_it_fails_the_random_read(cli, deps):  # noqa: F811
    produce(deps, "f", [entries("f0", 20, 50)])
    path = deps.tier1.path("f", 0)
    index_at = frames.HEADER_LEN[frames.VERSION] + 20 * (16 + 50)
    _flip_at(path, index_at + 4 * 8 + 7)  # index entry 4
    assert "expected 4" in cli("read", "f", "--from", "0:4", "--to", "0:4").one_line_error(1)  # through the index
    bad = cli("verify", "f", "--json")  # before: every frame read in order, OK
    assert bad.returncode == 1 and "index entry 4" in bad.json["problems"][0]
