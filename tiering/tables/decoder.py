"""The optional payload decoder of a topic's table (pure: no I/O). `json` with declared fields turns each
entry's JSON object into columns beside `payload`; an entry that does not decode (not JSON, not an object,
a value of the wrong type) is a dead letter with the reason, written to the table `TABLE__dlq`, never dropped.

A decoder spec is `{"kind": "json", "fields": [{"name": "amount", "type": "double"}, ...]}`; on the command
line `--table-json-fields amount:double,id:int64`. A changed spec may only add fields (each a nullable
column: old snapshots and files read it as null); changing or removing a field's type is refused."""
from __future__ import annotations

import json
import math
import re
from datetime import datetime, timezone

from tiering.errors import BadInput
from tiering.tables.naming import PARTITION_FIELD

TYPES = ("string", "int64", "double", "boolean", "timestamp")
BASE_COLUMNS = ("topic", "ledger_id", "entry_id", "payload", "sealed_at", "offloaded_at")
_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,63}$")
INT64 = 2 ** 63


def parse_fields(text: str) -> dict:
    """`name:type,name:type` as a decoder spec, else BadInput with the reason."""
    if not isinstance(text, str) or not text.strip():
        raise BadInput("a JSON decoder needs fields: NAME:TYPE[,NAME:TYPE...], TYPE one of " + ", ".join(TYPES))
    fields = []
    for part in text.split(","):
        name, sep, kind = part.strip().partition(":")
        if not sep:
            raise BadInput(f"decoder field {part.strip()!r} is not NAME:TYPE")
        fields.append({"name": name.strip(), "type": kind.strip()})
    return check_spec({"kind": "json", "fields": fields})


def check_spec(spec: object) -> dict:
    if not isinstance(spec, dict) or spec.get("kind") != "json" or not isinstance(spec.get("fields"), list) \
            or not spec["fields"]:
        raise BadInput("a decoder is {\"kind\": \"json\", \"fields\": [{\"name\": ..., \"type\": ...}, ...]}")
    seen = set()
    for f in spec["fields"]:
        name, kind = (f.get("name"), f.get("type")) if isinstance(f, dict) else (None, None)
        if not isinstance(name, str) or not _NAME.match(name) or name.endswith("\n"):
            raise BadInput(f"decoder field name {name!r} is not a lower-case name (letters, digits, _; 1 to 64)")
        if name in BASE_COLUMNS:
            raise BadInput(f"decoder field {name!r} is one of the table's own columns")
        if name == PARTITION_FIELD:  # a column of that name makes the table impossible to create or evolve
            raise BadInput(f"decoder field {name!r} is the name of the table's partition field")
        if name in seen:
            raise BadInput(f"decoder field {name!r} is declared twice")
        if kind not in TYPES:
            raise BadInput(f"decoder field {name!r} has type {kind!r}; types are " + ", ".join(TYPES))
        seen.add(name)
    return {"kind": "json", "fields": [{"name": f["name"], "type": f["type"]} for f in spec["fields"]]}


def check_change(old: dict | None, new: dict) -> None:
    """A decoder may only gain fields: an old file must still read under the new schema."""
    if old is None:
        return
    new_types = {f["name"]: f["type"] for f in new["fields"]}
    for f in old["fields"]:
        if new_types.get(f["name"]) != f["type"]:
            raise BadInput(f"a decoder can only add fields: {f['name']!r} was {f['type']}, now "
                           f"{new_types.get(f['name']) or 'removed'}")


class _OutOfRange:
    """A JSON number no column holds: a literal beyond a double's range (Python parses 1e400 as infinity),
    or an integer longer than Python converts (4,300 digits). Kept as its text: in a declared field it makes
    the entry a dead letter; in any other field it is ignored, as every other value there is."""

    def __init__(self, text: str):
        self.text = text


def _parse_float(text: str):
    f = float(text)
    return _OutOfRange(text) if math.isinf(f) else f


def _parse_int(text: str):
    try:
        return int(text)
    except ValueError:  # more digits than int() converts
        return _OutOfRange(text)


def _parse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")  # NaN, Infinity, -Infinity: Python's extension


def _value(kind: str, v):
    """The column value of a JSON value, or raise ValueError with the reason."""
    if v is None:
        return None
    if isinstance(v, _OutOfRange):
        if kind not in ("int64", "double"):
            raise ValueError(f"expected a {kind}, got a number")
        raise ValueError(f"the number {v.text[:40]}{'...' if len(v.text) > 40 else ''} is out of range "
                         f"for {kind}")
    if kind == "string":
        if not isinstance(v, str):
            raise ValueError(f"expected a string, got {type(v).__name__}")
        try:  # JSON's "\ud800" escape decodes to a lone surrogate, which no UTF-8 column can hold
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("expected a string, got one with a lone surrogate (not valid Unicode)") from None
        return v
    if kind == "int64":
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"expected a 64-bit integer, got {type(v).__name__}")
        if not -INT64 <= v < INT64:
            raise ValueError(f"expected a 64-bit integer, got {v if abs(v) < 10**40 else 'an integer'} "
                             "(out of the 64-bit range)")
        return v
    if kind == "double":
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {type(v).__name__}")
        try:
            return float(v)
        except OverflowError:  # an integer of hundreds of digits
            raise ValueError("expected a number, got an integer too large for a double") from None
    if kind == "boolean":
        if not isinstance(v, bool):
            raise ValueError(f"expected true or false, got {type(v).__name__}")
        return v
    if not isinstance(v, str):  # timestamp
        raise ValueError(f"expected an ISO 8601 timestamp string, got {type(v).__name__}")
    t = datetime.fromisoformat(v.replace("Z", "+00:00"))
    try:  # "0001-01-01T00:00:00+01:00" is before year 1 in UTC
        return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)
    except OverflowError:
        raise ValueError(f"timestamp {v[:40]!r} is out of range in UTC") from None


def decode(spec: dict, payload: bytes) -> tuple[dict | None, str | None]:
    """({field: value}, None) of a payload, or (None, reason) for a dead letter. Never raises on a payload:
    one entry that crashed the decoder would fail every sync of its topic, for ever."""
    try:
        # UTF-8 only (a leading byte order mark ignored, as RFC 8259 allows): json.loads of bytes would also
        # take UTF-16 and UTF-32, and encoded surrogates (surrogatepass)
        text = payload.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8: {str(exc)[:200]}"
    try:
        obj = json.loads(text, parse_float=_parse_float, parse_int=_parse_int, parse_constant=_parse_constant)
    except ValueError as exc:
        return None, f"not JSON: {str(exc)[:200]}"
    except RecursionError:  # arrays or objects nested thousands deep
        return None, "not JSON this decoder reads: nested too deep"
    if not isinstance(obj, dict):
        return None, f"not a JSON object: {type(obj).__name__}"
    out = {}
    for f in spec["fields"]:
        try:
            out[f["name"]] = _value(f["type"], obj.get(f["name"]))
        except ValueError as exc:
            return None, f"field {f['name']!r}: {str(exc)[:200]}"
    return out, None
