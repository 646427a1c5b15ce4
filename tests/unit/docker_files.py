"""The Docker deployment's files read without Docker: Compose's `${VAR}`, `${VAR:-default}`, `${VAR-default}`,
`${VAR:?err}` substitution done the way Docker Compose does it (so the compose file is checked as the
containers will see it), env files, and string constants of Python modules read without importing them."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any, Mapping

class MissingVariable(Exception):
    pass


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def interpolate(text: str, env: Mapping[str, str], unset: set[str] | None = None) -> str:
    """`$$`, `$VAR`, `${VAR}`, `${VAR:-default}`, `${VAR-default}`, `${VAR:?err}`, `${VAR?err}`,
    `${VAR:+alt}`, `${VAR+alt}`, defaults nested; names read while unset and without a default go to
    `unset`."""
    out, i = [], 0
    while i < len(text):
        if text[i] != "$":
            out.append(text[i])
            i += 1
            continue
        nxt = text[i + 1:i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "{":
            j, depth = i + 2, 1
            while j < len(text) and depth:
                if text.startswith("$$", j):
                    j += 2
                    continue
                if text.startswith("${", j):
                    depth, j = depth + 1, j + 2
                    continue
                if text[j] == "}":
                    depth -= 1
                j += 1
            if depth:
                raise ValueError(f"unclosed ${{ in {text!r}")
            out.append(_expand(text[i + 2:j - 1], env, unset))
            i = j
        else:
            m = _NAME.match(text, i + 1)
            if not m:
                raise ValueError(f"a lone '$' in {text!r}: write '$$' for a literal dollar")
            out.append(_lookup(m.group(), env, unset))
            i = m.end()
    return "".join(out)


def _lookup(name: str, env: Mapping[str, str], unset: set[str] | None) -> str:
    if name not in env and unset is not None:
        unset.add(name)
    return env.get(name, "")


def _expand(expr: str, env: Mapping[str, str], unset: set[str] | None) -> str:
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?+])(.*))?", expr, re.S)
    if not m:
        raise ValueError(f"bad substitution ${{{expr}}}")
    name, op, arg = m.groups()
    if op is None:
        return _lookup(name, env, unset)
    value = env.get(name)
    present = value is not None and (value != "" or not op.startswith(":"))
    if op.endswith("-"):
        return value if present else interpolate(arg, env, unset)
    if op.endswith("?"):
        if not present:
            raise MissingVariable(f"{name}: {arg}")
        return value
    return interpolate(arg, env, unset) if present else ""  # ":+" / "+"


def interpolate_tree(node: Any, env: Mapping[str, str], unset: set[str] | None = None) -> Any:
    if isinstance(node, str):
        return interpolate(node, env, unset)
    if isinstance(node, list):
        return [interpolate_tree(v, env, unset) for v in node]
    if isinstance(node, dict):
        return {k: interpolate_tree(v, env, unset) for k, v in node.items()}
    return node


def variables_in(node: Any) -> set[str]:
    """Every variable name the file substitutes (outside `$$` escapes)."""
    if isinstance(node, str):
        names = set()
        for m in re.finditer(r"\$(\$|\{?([A-Za-z_][A-Za-z0-9_]*))", node):
            if m.group(1) != "$":
                names.add(m.group(2))
        return names
    if isinstance(node, list):
        return set().union(*(variables_in(v) for v in node)) if node else set()
    if isinstance(node, dict):
        return set().union(*(variables_in(v) for v in node.values())) if node else set()
    return set()


def read_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, sep, value = line.partition("=")
            assert sep, f"{path.name}: not KEY=VALUE: {line!r}"
            env[key.strip()] = value.strip()
    return env


def python_constant(path: Path, name: str) -> str:
    """A module-level string constant, read without importing the module (no Airflow import here)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{name} not found in {path}")
