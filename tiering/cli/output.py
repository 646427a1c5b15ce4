"""What the `tiering` command writes: one output object, text or JSON, chosen once from `--json` (handlers
never branch on it); one-line, redacted error messages on stderr; progress bars on a terminal only.

The JSON language of every command (README, "The `tiering` command"), built here so every command speaks it:
one object per command (`document`): `"command"` (the command line's words, e.g. "topic show"), `"topic"`
(the topic it was limited to, or null), ledgers as `{"topic", "ledger"}` (`ledger_refs`), `"failed"` always
a list of `{"topic", "ledger", "error"}` (or `{"key", "error"}` for an object of tier 2; `failures`),
counts as integers named `*_count`, byte amounts named `bytes` or `*_bytes`, timestamps ISO 8601 UTC with
`Z` (`iso`), `"dry_run": true` on a preview. `read --json` alone streams: one JSON line per entry or gap.
`check_document` states the rules as a check (the tests walk every command with it)."""
from __future__ import annotations

import base64
import json
import logging
import os
import re
import sys
from datetime import date, datetime, timezone
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator

from tiering.cli.args import one_line
from tiering.database_url import SECRET_URL_PARAMS


_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)\S*@")  # greedy: up to the last @ of the URL


def redact(text: str) -> str:
    """Mask the secrets of the environment (the database password, before the host or in the query; the S3
    secret key) in a message, and the user info of any URL in it. A password with an unescaped `@` is split
    differently by each parser (the driver may take its tail for the host and print it with no URL around
    it), so the user info is taken up to the last `@` and each piece of the password between `@`, `/`, `?`
    or `#` is masked too."""
    from urllib.parse import parse_qsl, quote, unquote

    secrets = [os.environ.get("AWS_SECRET_ACCESS_KEY") or ""]
    url = os.environ.get("TIERING_DATABASE_URL", "")
    userinfo = url.split("://", 1)[1].rpartition("@")[0] if "://" in url else ""
    if ":" in userinfo:
        password = userinfo.split(":", 1)[1]
        for s in [password, *re.split(r"[@/?#]", password)]:
            secrets += [s, unquote(s)]
    for key, value in parse_qsl(url.partition("?")[2].partition("#")[0], keep_blank_values=True):
        if key in SECRET_URL_PARAMS:  # libpq takes them from the query too
            secrets += [value, quote(value, safe="")]
    for s in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(s, "***")
    return _USERINFO.sub(r"\1***@", text)


def error(message: str) -> None:
    sys.stderr.write(one_line(redact(f"tiering: error: {message}")) + "\n")
    sys.stderr.flush()


def warning(message: str) -> None:
    sys.stderr.write(one_line(redact(f"tiering: warning: {message}")) + "\n")
    sys.stderr.flush()


class _Collected(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def warnings_after(logger_name: str) -> Iterator[None]:
    """What `logger_name` warns about during the block (a read falling back to tier 2, say), printed as
    `tiering: warning: ...` lines on stderr, redacted as errors are, when the block ends without an exception:
    a failure's one line on stderr stays its only line (the CLI keeps every other record off stderr:
    main._quiet_libraries)."""
    logger, collected = logging.getLogger(logger_name), _Collected()
    logger.addHandler(collected)
    try:
        yield
    finally:
        logger.removeHandler(collected)
    for message in collected.messages:
        warning(message)


def _json_default(value):
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    return str(value)  # Position, Path, enums: their text


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=_json_default) + "\n")


def document(command: str, topic: str | None = None, **fields) -> dict:
    """One command's JSON object: "command" and "topic" first, then its fields."""
    return {"command": command, "topic": topic, **fields}


def ledger_refs(pairs: Iterable) -> list[dict]:
    """Ledgers as `{"topic", "ledger"}`, from (topic, ledger id) pairs or Ledger rows."""
    out = []
    for p in pairs:
        topic, ledger = (p.topic, p.ledger_id) if hasattr(p, "ledger_id") else p
        out.append({"topic": topic, "ledger": ledger})
    return out


def failures(items: Iterable) -> list[dict]:
    """`failed` as a list of `{"topic", "ledger", "error"}`: from (topic, ledger, error) triples, or dicts
    that already have those keys (or `{"key", "error"}`: an object of tier 2)."""
    out = []
    for item in items:
        if isinstance(item, dict):
            out.append(dict(item))
        else:
            topic, ledger, err = item
            out.append({"topic": topic, "ledger": ledger, "error": err})
    return out


def exit_failed(failed: list[dict], what: str, verb: str = "failed") -> int:
    """A command's exit status from its JSON's `failed` list: 0 when empty, else 1 with the count and the first
    item as the one line on stderr ("2 ledger(s) failed; first: 'orders' ledger 7: ..."), so every command
    names its first failure the same way."""
    if not failed:
        return 0
    first = failed[0]
    if "key" in first:
        where = first["key"]
    else:
        where = f"{first['topic']!r}" + (f" ledger {first['ledger']}" if first.get("ledger") is not None else "")
    error(f"{len(failed)} {what} {verb}; first: {where}: {first['error']}")
    return 1


def printable(data: bytes) -> str:
    """One line per entry: backslash escapes for the backslash, control characters and invalid UTF-8."""
    out = []
    for c in data.decode("utf-8", "surrogateescape"):
        if "\udc80" <= c <= "\udcff":  # a byte that is not UTF-8
            out.append(f"\\x{ord(c) - 0xDC00:02x}")
        elif c == "\\":
            out.append("\\\\")
        elif c.isprintable():
            out.append(c)
        else:
            out.append(c.encode("unicode_escape").decode("ascii"))
    return "".join(out)


def position_text(p) -> str | None:
    """A position as `L:E` (None stays None)."""
    return None if p is None else str(p)


def subscription_at(p) -> str:
    """A subscription's position in a sentence: `L:E`, or the start when it has read nothing."""
    return position_text(p) or "the start (nothing read)"


def iso(t) -> str | None:
    """A timestamp as ISO 8601 in UTC with `Z` (None stays None): 2026-11-25T14:15:41.084535Z."""
    if t is None:
        return None
    if isinstance(t, str):  # an ISO 8601 text with an offset (a manifest's): the same instant, with Z
        try:
            t = datetime.fromisoformat(t)
        except ValueError:
            return t
    if isinstance(t, datetime):
        if t.tzinfo is not None:
            t = t.astimezone(timezone.utc).replace(tzinfo=None)
        return t.isoformat() + "Z"
    if isinstance(t, date):
        return t.isoformat()
    return str(t)


_ISO_Z = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?Z")
LEDGER_LISTS = ("offloaded", "skipped", "deleted", "ledgers")  # lists of ledgers wherever they appear


# an integer under a name ending in one of these words is a count, named *_count ("lag_ledgers" is not)
_COUNTED = frozenset({"ledgers", "entries", "pages", "copies", "files", "objects", "rows", "topics", "groups",
                      "subscriptions", "keys", "parts", "uploads", "gaps", "problems"})
# a topic's policy names its limits as its flags do (`--rollover-entries`): a threshold, not a count of things
_LIMITS = frozenset({"rollover_entries"})


def check_document(obj: object, stream: bool = False) -> list[str]:
    """What breaks the JSON language in one command's output object (empty: none); `stream` for the
    lines of `read --json`. The rules of the module docstring, spelled out for the tests."""
    problems: list[str] = []
    if not isinstance(obj, dict):
        return [f"not one object: {type(obj).__name__}"]
    if not stream:
        if not isinstance(obj.get("command"), str):
            problems.append("no \"command\"")
        if "topic" not in obj or not isinstance(obj["topic"], (str, type(None))):
            problems.append("no \"topic\" (a name or null)")
        if "failed" in obj and not (isinstance(obj["failed"], list) and all(
                isinstance(f, dict) and "error" in f and ({"topic", "ledger"} <= f.keys() or "key" in f)
                for f in obj["failed"])):
            problems.append("\"failed\" is not a list of {topic, ledger, error} / {key, error}")
        for name in LEDGER_LISTS:
            value = obj.get(name)
            if isinstance(value, list) and not all(isinstance(x, dict) and {"topic", "ledger"} <= x.keys()
                                                   for x in value):
                problems.append(f"{name!r} is not a list of {{topic, ledger}}")

    def walk(value, path: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                where = f"{path}.{k}" if path else k
                if k.endswith("_count") and (isinstance(v, bool) or not isinstance(v, int)):
                    problems.append(f"{where} is a count but not an integer")
                if k.endswith("_at") and v is not None and not (isinstance(v, str) and _ISO_Z.fullmatch(v)):
                    problems.append(f"{where} is not an ISO 8601 UTC timestamp with Z: {v!r}")
                if isinstance(v, int) and not isinstance(v, bool):
                    last = k.rsplit("_", 1)[-1]
                    if k in ("deleted", "failed", "planned") or (last in _COUNTED and k not in _LIMITS):
                        problems.append(f"{where} is a count not named *_count")
                    if "bytes" in k.split("_") and not (k == "bytes" or k.endswith("_bytes")):
                        problems.append(f"{where} is a byte amount not named bytes or *_bytes")
                walk(v, where)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{path}[{i}]")
    walk(obj, "")
    return problems


def gap_dict(gap) -> dict:
    """`to` is null when the gap runs to the end of a lost ledger whose entry count is unknown."""
    return {"gap": gap.kind, "from": str(gap.start), "to": None if gap.end_unknown else str(gap.end)}


PAYLOAD_FORMATS = {"text": printable, "hex": lambda data: data.hex(),
                   "base64": lambda data: base64.b64encode(data).decode("ascii")}


class TextOutput:
    """For a person: summaries as sentences, rows as aligned tables, entries as `L:E<TAB>payload` (the
    payload in one declared form: `text` escapes what is not printable UTF-8, or `hex`, or `base64`), a gap
    as a line starting with `#`, which no entry line does."""

    def __init__(self, payload_format: str = "text"):
        self.payload = PAYLOAD_FORMATS[payload_format]

    def result(self, obj: dict, text: str) -> None:
        print(text)

    def listing(self, doc: dict, key: str, table: Callable[[list[dict]], Iterable[str]]) -> None:
        for line in table(doc[key]):
            print(line)

    def rows(self, rows: list[dict], table: Callable[[list[dict]], Iterable[str]]) -> None:
        for line in table(rows):
            print(line)

    def entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        sys.stdout.write(f"{ledger_id}:{entry_id}\t{self.payload(data)}\n")

    def gap(self, obj: dict) -> None:
        to = obj["to"] or f"the end of ledger {obj['from'].partition(':')[0]} (entry count unknown)"
        print(f"# {obj['gap']} gap from {obj['from']} to {to}")


class JsonOutput:
    """For a program (`--json`): a summary is one JSON object, a row or an entry one JSON line each."""

    def result(self, obj: dict, text: str) -> None:
        print_json(obj)

    def listing(self, doc: dict, key: str, table: Callable[[list[dict]], Iterable[str]]) -> None:
        print_json(doc)  # one object, its rows under `key`, also when there are none

    def rows(self, rows: list[dict], table: Callable[[list[dict]], Iterable[str]]) -> None:
        # a line per row, nothing when empty: not the JSON language; commands list rows with `listing`
        for r in rows:
            print_json(r)

    def entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        print_json({"ledger": ledger_id, "entry": entry_id, "data": base64.b64encode(data).decode()})

    def gap(self, obj: dict) -> None:
        print_json(obj)


Output = TextOutput | JsonOutput


def output_for(args) -> Output:
    return JsonOutput() if getattr(args, "json", False) else TextOutput(getattr(args, "format", None) or "text")


class NoBar:
    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(desc: str, total: int | None, unit: str = "it", stream=None):
    """A tqdm bar on stderr when it is a terminal; an object that ignores updates otherwise."""
    stream = stream or sys.stderr
    if not stream.isatty():
        return NoBar()
    from tqdm import tqdm  # only on a terminal: piped runs do not pay for importing it

    scale = unit == "B"
    return tqdm(total=total, desc=desc, file=stream, unit=unit, unit_scale=scale, unit_divisor=1024 if scale else 1000,
                leave=False)


def progress(iterable, desc: str, stream, unit: str = "it"):
    """tqdm progress over an iterable when attached to a terminal; the bare iterable otherwise."""
    if not stream.isatty():
        return iterable
    from tqdm import tqdm  # only on a terminal, as above

    return tqdm(iterable, desc=desc, file=stream, unit=unit, leave=False)
