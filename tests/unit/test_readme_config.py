"""The README's configuration table lists exactly the variables `Settings.from_env` reads, each with its
default; and the defaults it shows are the ones from_env applies."""
import re
from pathlib import Path

import pytest

from tiering.config import INTS, VARIABLES, Settings

README = Path(__file__).resolve().parents[2] / "README.md"
ROW = re.compile(r"^\| `([A-Z0-9_]+)` \| ([^|]+) \|")


def readme_rows(heading: str, row: re.Pattern, table: str) -> dict[str, re.Match]:
    """The rows `row` matches in the README's section under `heading` (e.g. "## Configuration", up to the next
    heading of its level), by their first group, each once."""
    level = heading.split(" ", 1)[0]
    section = README.read_text(encoding="utf-8").split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = row.match(line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} is listed twice in the README's {table} table"
            rows[m.group(1)] = m
    return rows


def readme_table() -> dict[str, str]:
    """variable -> its default cell, from the table under '## Configuration'."""
    return {name: m.group(2).strip().strip("`")
            for name, m in readme_rows("## Configuration", ROW, "configuration").items()}


def test_every_variable_config_reads_is_in_the_readme_table_with_its_default():
    table = readme_table()
    assert sorted(table) == sorted(v.name for v in VARIABLES), \
        "README's configuration table and config.VARIABLES list different variables"
    for v in VARIABLES:
        assert table[v.name] == v.default, f"README's default of {v.name} is {table[v.name]!r}, config's {v.default!r}"


REQUIRED = {"TIERING_DATABASE_URL": "postgresql://u@db/t", "TIERING_BUCKET": "bkt", "TIERING_TIER1_ROOT": "/data/t1"}


def test_the_documented_defaults_are_the_applied_ones():
    settings = Settings.from_env(REQUIRED)
    assert {v.name for v in VARIABLES if v.default == "required"} == set(REQUIRED)
    for v in VARIABLES:
        value = getattr(settings, v.field)
        if v.default == "unset":
            assert value is None, v.name
        elif v.ints is not None:
            assert value == v.ints.default == INTS[v.field].default, v.name
        elif v.default != "required":
            assert str(value) == v.default, v.name


@pytest.mark.parametrize("v", [v for v in VARIABLES if v.ints], ids=lambda v: v.name)
def test_an_integer_default_reads_back_as_shown(v):
    number, _, unit = v.default.partition(" ")
    assert int(number) * {"": 1, "KiB": 1024, "MiB": 1024 * 1024}[unit] == v.ints.default


def test_every_settings_field_has_one_variable():
    from dataclasses import fields

    derived = {"s3_sse_c_key"}  # read from the key file's path, never from a variable
    assert sorted(v.field for v in VARIABLES) == sorted(f.name for f in fields(Settings) if f.name not in derived)
