import pytest

from tiering.errors import BadInput
from tiering.model import Position, TopicPolicy


@pytest.mark.parametrize("text,pos", [("0:0", Position(0, 0)), ("3:17", Position(3, 17)), ("012:1", Position(12, 1))])
def test_position_parse(text, pos):
    assert Position.parse(text) == pos


@pytest.mark.parametrize("bad", ["", "3", "3:", ":1", "-1:0", "a:b", "1:2:3", "1;2", "99999999999999999999:0",
                                 " 12:1 ", "1:0\n", "1:0\v", "\u0661:\u0660", "\uff11:\uff10", "+1:0", "1_0:0"])
def test_position_parse_rejects(bad):
    with pytest.raises(BadInput, match="malformed position"):
        Position.parse(bad)


def test_position_too_long_says_its_bound():
    """A 19-digit id is ASCII digits: the refusal names the bound, not the syntax."""
    with pytest.raises(BadInput, match=r"malformed position '5:9223372036854775807': .*each 1 to 18 ASCII digits"):
        Position.parse("5:9223372036854775807")


def test_positions_order_like_pulsar():
    assert Position(1, 99) < Position(2, 0) < Position(2, 1)


@pytest.mark.parametrize("field,value", [("offload_after_seconds", -2), ("deletion_lag_seconds", -1),
                                         ("rollover_entries", 0), ("retention_bytes", -5)])
def test_policy_rejects(field, value):
    with pytest.raises(BadInput):
        TopicPolicy(**{field: value})
