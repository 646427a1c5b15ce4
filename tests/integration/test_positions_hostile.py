"""Positions past a ledger's end refused the same way by every command (exit 2, nothing written), and a
`read --ack` whose subscription was moved forward meanwhile succeeding without moving it back."""
from __future__ import annotations

import pytest

from tests.integration.helpers import entries, produce
from tests.integration.test_cli import cli, snapshot  # noqa: F401 (the fixture)
from tiering.errors import BadInput
from tiering.model import LedgerState as S, Position, TopicPolicy

TEN = dict(rollover_entries=10, rollover_bytes=2**40)


def position(cli, topic, name):
    listed = cli("subscription", "list", topic, "--json").ok().json["subscriptions"]
    return next(s["position"] for s in listed if s["subscription"] == name)


def test_read_ack_after_retention_moved_the_subscription_past_it(cli, deps, monkeypatch, capsys):
    from tiering.cli.main import main
    from tiering.ops import retention, subscriptions

    produce(deps, "c", [entries(f"l{i}", 10, 100) for i in range(3)], TopicPolicy(**TEN, max_retention_bytes=1000))
    cli("subscription", "create", "c", "rd").ok()
    real_ack = subscriptions.ack

    def ack_after_retention(*args, **kwargs):  # retention commits between the read and its ack
        retention.retention(deps, "c")
        return real_ack(*args, **kwargs)

    monkeypatch.setattr(subscriptions, "ack", ack_after_retention)
    for key, value in cli.env.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    code = main(["read", "c", "--subscription", "rd", "--max-entries", "5", "--ack"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(out.splitlines()) == 5 and "moved to 1:9 meanwhile" in err and "error" not in err
    monkeypatch.setattr(subscriptions, "ack", real_ack)
    assert [led.state for led in deps.meta.list_ledgers("c")][:2] == [S.DELETED, S.DELETED]
    assert position(cli, "c", "rd") == "1:9"  # left where retention put it
    # an explicit ack of a position behind the subscription is still a mistake
    assert "never moves backwards" in cli("subscription", "ack", "c", "rd", "1:3").one_line_error(2)
    # the reader goes on from there
    cli("read", "c", "--subscription", "rd", "--max-entries", "2", "--ack").ok()
    assert position(cli, "c", "rd") == "2:1"


def test_printed_ack_never_moves_a_subscription_back(cli, deps):
    from tiering.ops.subscriptions import ack

    produce(deps, "p", [entries("a", 10, 100), entries("b", 10, 100)], TopicPolicy(**TEN))
    cli("subscription", "create", "p", "s").ok()
    cli("subscription", "ack", "p", "s", "1:5").ok()
    assert ack(deps, "p", "s", Position(0, 3), reader=deps.meta.subs.get("p", "s")).position == Position(1, 5)
    assert ack(deps, "p", "s", Position(1, 7), reader=deps.meta.subs.get("p", "s")).position == Position(1, 7)
    with pytest.raises(BadInput, match="never moves backwards"):
        ack(deps, "p", "s", Position(1, 2))


def test_offload_prefix_and_truncate_refuse_past_the_open_ledgers_end(cli, deps):
    produce(deps, "o", [entries("a", 10, 100)], TopicPolicy(**TEN), open_tail=[b"x"] * 4)
    before = snapshot(deps)
    for args in (("offload-prefix", "o", "1:999"), ("offload-prefix", "o", "1:5"),
                 ("offload-prefix", "o", "1:5", "--dry-run"), ("truncate", "o", "0:11", "--force", "--dry-run"),
                 ("truncate", "o", "0:11", "--force"), ("truncate", "o", "1:999", "--force", "--dry-run"),
                 ("truncate", "o", "1:5", "--force")):
        assert "beyond the end of ledger" in cli(*args).one_line_error(2), args
    assert snapshot(deps) == before
    with pytest.raises(BadInput, match=r"beyond the end of ledger 1 \(4 entries, open\)"):
        deps.meta.trims.truncate("o", Position(1, 999), True, deps.knobs.gc_delay, dry_run=True,
                                 open_entries=lambda led: deps.tier1.extent(led)[0])
    assert deps.meta.trims.truncate("o", Position(1, 4), True, deps.knobs.gc_delay, dry_run=True,
                                    open_entries=lambda led: deps.tier1.extent(led)[0]).deleted
    assert snapshot(deps) == before
    cli("truncate", "o", "0:10", "--dry-run").ok()
    cli("offload-prefix", "o", "1:4", "--dry-run").ok()
    cli("offload-prefix", "o", "--all-sealed").ok()
    assert [led.state for led in deps.meta.list_ledgers("o")] == [S.OFFLOADED, S.OPEN]


def test_the_end_of_a_sealed_topic_is_still_a_position(cli, deps):
    produce(deps, "e", [entries("a", 10, 100), entries("b", 10, 100)], TopicPolicy(**TEN))
    assert "beyond the end" in cli("offload-prefix", "e", "2:1").one_line_error(2)
    cli("offload-prefix", "e", "1:10", "--dry-run").ok()
    cli("offload-prefix", "e", "2:0").ok()
    assert [led.state for led in deps.meta.list_ledgers("e")] == [S.OFFLOADED, S.OFFLOADED]


def test_read_past_a_trimmed_ledgers_end_is_refused(cli, deps):
    produce(deps, "d", [entries("a", 10, 100), entries("b", 10, 100)], TopicPolicy(**TEN), open_tail=[b"x"])
    cli("truncate", "d", "1:0").ok()
    assert deps.meta.list_ledgers("d")[0].state == S.DELETED
    assert "beyond the end of ledger 0 (10 entries, trimmed)" in \
        cli("read", "d", "--from", "0:999").one_line_error(2)
    assert "beyond the end of ledger 0" in cli("read", "d", "--from", "0:11").one_line_error(2)
    rows = cli("read", "d", "--from", "0:3", "--json").ok().json_lines
    assert rows[0].get("gap") == "TRIMMED" and rows[0]["from"] == "0:3" and rows[-1]["ledger"] == 2, rows[:2]
    rows = cli("read", "d", "--from", "0:10", "--json").ok().json_lines  # its end: the read starts after it
    assert (rows[0].get("ledger"), rows[0].get("entry")) == (1, 0) and rows[-1]["ledger"] == 2, rows[:2]


def test_a_readers_ack_never_undoes_a_reset_or_lands_on_a_new_subscription(cli, deps):
    from tiering.errors import TieringError
    from tiering.ops.subscriptions import ack

    produce(deps, "q", [entries("a", 10, 100), entries("b", 10, 100)], TopicPolicy(**TEN))
    cli("subscription", "create", "q", "s").ok()
    cli("subscription", "ack", "q", "s", "1:5").ok()
    as_read = deps.meta.subs.get("q", "s")  # `read --subscription s --ack` starts: prints 1:6..1:8
    cli("subscription", "ack", "q", "s", "0:0", "--reset").ok()  # an operator asks for a replay meanwhile
    assert ack(deps, "q", "s", Position(1, 8), reader=as_read).position == Position(0, 0)
    assert position(cli, "q", "s") == "0:0"
    cli("subscription", "delete", "q", "s").ok()
    cli("subscription", "create", "q", "s", "--from", "earliest").ok()
    with pytest.raises(TieringError, match="deleted and created again"):
        ack(deps, "q", "s", Position(1, 8), reader=as_read)
    assert position(cli, "q", "s") is None


def test_an_ack_racing_delete_and_create_of_its_name_acks_the_new_subscription(cli, deps, monkeypatch):
    """`subscription ack` reads the row, then another process deletes the subscription and makes it again
    (the new row at version 0 as well) before the compare-and-set: the ack must land on the row that has the
    name now, not report success having written nothing."""
    from tiering.ops import subscriptions

    produce(deps, "n", [entries("a", 10, 100)], TopicPolicy(**TEN))
    cli("subscription", "create", "n", "s").ok()
    real = subscriptions._check_entry
    raced = []

    def delete_and_create_meanwhile(d, topic, pos):
        if not raced:
            raced.append(1)
            deps.meta.subs.delete("n", "s")
            deps.meta.subs.create("n", "s", None)
        return real(d, topic, pos)

    monkeypatch.setattr(subscriptions, "_check_entry", delete_and_create_meanwhile)
    got = subscriptions.ack(deps, "n", "s", Position(0, 3))
    assert raced and got.position == Position(0, 3)
    assert position(cli, "n", "s") == "0:3"


def test_offload_prefix_of_an_empty_or_fully_trimmed_topic_has_nothing_to_do(cli, deps):
    cli("topic", "create", "e").ok()
    for args in (("--all-sealed",), ("0:0",)):
        got = cli("offload-prefix", "e", *args, "--json").ok().json
        assert got["offloaded"] == [] and got["failed"] == [] and got["offloaded_count"] == 0
    assert "beyond the end" in cli("offload-prefix", "e", "0:1").one_line_error(2)
    produce(deps, "g", [entries("g", 5, 10)], TopicPolicy(**TEN))
    cli("topic", "set", "g", "--retention-time", "0").ok()
    assert cli("retention", "--json").ok().json["deleted"] == [{"topic": "g", "ledger": 0}]
    assert cli("offload-prefix", "g", "--all-sealed", "--json").ok().json["offloaded"] == []
    assert "not the end of the topic" in cli("offload-prefix", "g", "0:2").one_line_error(2)


def test_a_topic_made_again_without_ledgers_ends_at_its_next_ledger(cli, deps):
    # deleted and made again, the topic's first ledger will be 3, not 0: 3:0 is its end (fine for every
    # command), what lies before it was never the new topic's, and past it is past the end
    produce(deps, "r", [entries(f"old{i}", 4, 10) for i in range(3)], TopicPolicy(**TEN))
    cli("topic", "delete", "r").ok()
    cli("topic", "create", "r", "--rollover-entries", "10").ok()
    for start in ("0:0", "2:0", "3:0"):
        assert cli("read", "r", "--from", start, "--json").ok().json_lines == [], start
    for start in ("3:1", "4:0"):
        assert "beyond the end of topic 'r' (no ledgers)" in cli("read", "r", "--from", start).one_line_error(2)
    got = cli("offload-prefix", "r", "--all-sealed", "--json").ok().json
    assert (got["position"], got["first_not_offloaded"], got["offloaded"]) == ("3:0", "3:0", [])
    assert cli("offload-prefix", "r", "3:0", "--json").ok().json["first_not_offloaded"] == "3:0"
    assert "before the first ledger 3" in cli("offload-prefix", "r", "2:0").one_line_error(2)
    assert "beyond the end" in cli("offload-prefix", "r", "3:1").one_line_error(2)
    cli("produce", "r", "--entries", "4", "--entry-size", "10").ok()
    assert [row["ledger"] for row in cli("read", "r", "--from", "0:0", "--json").ok().json_lines] == [3] * 4


def test_read_ack_acknowledges_what_it_printed_before_tier2_failed(cli, tier1_root):
    """A read meeting a ledger it cannot get (its tier-1 copy gone by hand, tier 2 down) fails; what it printed
    before was delivered and is acknowledged (it was re-delivered, up to a thousand entries each time)."""
    from tiering.tier1 import ledger_path

    cli("topic", "create", "ak", "--rollover-entries", "2").ok()
    cli("produce", "ak", "--entries", "7", "--entry-size", "10").ok()  # ledgers 0-2 sealed, 3 open
    cli("subscription", "create", "ak", "r", "--from", "earliest").ok()
    cli("offload-prefix", "ak", "--all-sealed").ok()
    ledger_path(tier1_root, "ak", 2).unlink()  # ledger 2 now only in tier 2, which is down below
    res = cli("read", "ak", "--subscription", "r", "--ack", env={"TIERING_S3_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert "S3 " in res.one_line_error(1) and len(res.stdout.splitlines()) == 4
    [sub] = cli("subscription", "list", "ak", "--json").ok().json["subscriptions"]
    assert sub["position"] == "1:1"
