"""What the `tiering` command writes: one output object, text or JSON, chosen once from `--json` (handlers
never branch on it); one-line, redacted error messages on stderr; progress bars on a terminal only."""
from __future__ import annotations

import base64
import json
import os
import sys
from typing import Callable, Iterable

from tiering.cli.args import one_line


def redact(text: str) -> str:
    """Mask the secrets of the environment (the database password, the S3 secret key) in a message."""
    from urllib.parse import unquote, urlsplit

    secrets = [os.environ.get("AWS_SECRET_ACCESS_KEY") or ""]
    try:
        password = urlsplit(os.environ.get("TIERING_DATABASE_URL", "")).password
    except ValueError:
        password = None
    if password:
        secrets += [password, unquote(password)]
    for s in sorted((s for s in secrets if len(s) >= 3), key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def error(message: str) -> None:
    sys.stderr.write(one_line(redact(f"tiering: error: {message}")) + "\n")
    sys.stderr.flush()


def print_json(obj) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")


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


def iso(t) -> str | None:
    """A timestamp as ISO 8601 (None stays None)."""
    return None if t is None else t.isoformat()


def gap_dict(gap) -> dict:
    return {"gap": gap.kind, "from": str(gap.start), "to": str(gap.end)}


class TextOutput:
    """For a person: summaries as sentences, rows as aligned tables, entries as `L:E<TAB>data`."""

    def result(self, obj: dict, text: str) -> None:
        print(text)

    def rows(self, rows: list[dict], table: Callable[[list[dict]], Iterable[str]]) -> None:
        for line in table(rows):
            print(line)

    def entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        sys.stdout.write(f"{ledger_id}:{entry_id}\t{printable(data)}\n")

    def gap(self, obj: dict) -> None:
        print_json(obj)  # a gap is a JSON line in both outputs: a reader of text output can still tell


class JsonOutput:
    """For a program (`--json`): a summary is one JSON object, a row or an entry one JSON line each."""

    def result(self, obj: dict, text: str) -> None:
        print_json(obj)

    def rows(self, rows: list[dict], table: Callable[[list[dict]], Iterable[str]]) -> None:
        for r in rows:
            print_json(r)

    def entry(self, ledger_id: int, entry_id: int, data: bytes) -> None:
        print_json({"ledger": ledger_id, "entry": entry_id, "data": base64.b64encode(data).decode()})

    def gap(self, obj: dict) -> None:
        print_json(obj)


Output = TextOutput | JsonOutput


def output_for(args) -> Output:
    return JsonOutput() if getattr(args, "json", False) else TextOutput()


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
