"""The metadata database's URL (pure: strings in, strings out): its check as a setting, its secrets (a password
before the host, or libpq's `password` / `sslpassword` in the query) kept out of what travels to executors
and of messages, and its TLS parameters for clients that do not take the URL itself."""
from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlsplit

from tiering.errors import ConfigError

PG_SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
# libpq's URL parameters that are secrets: the password (libpq takes it in the query as well as before the
# host) and the passphrase of the client key
SECRET_URL_PARAMS = ("password", "sslpassword")


def secret_params(query: str) -> list[str]:
    return [kv for kv in query.split("&") if kv.partition("=")[0] in SECRET_URL_PARAMS] if query else []


def has_password(url: str) -> bool:
    """Whether the database URL holds a secret: a password before the host, or `password` / `sslpassword`
    in its query."""
    return without_password(url) != url


def without_password(url: str) -> str:
    """The URL without its secrets: what travels in a pickle to executors."""
    parts = urlsplit(url)
    if parts.password is None and not secret_params(parts.query):
        return url
    if parts.password is not None:
        host = parts.netloc.rpartition("@")[2]
        parts = parts._replace(netloc=f"{parts.username}@{host}" if parts.username is not None else host)
    return parts._replace(query="&".join(kv for kv in parts.query.split("&") if kv not in
                                         secret_params(parts.query))).geturl()


def with_local_password(url: str, local: str | None) -> str:
    """`url` (come without its secrets) with those of `local`, this process's own setting, when both name the
    same user, host, port and database."""
    ours = urlsplit(url)
    if ours.password is not None or secret_params(ours.query) or not local:
        return url
    try:
        theirs = urlsplit(local)
        same = (theirs.hostname, theirs.port, theirs.username, theirs.path) == \
            (ours.hostname, ours.port, ours.username, ours.path)
    except ValueError:  # a malformed local setting: libpq's own sources, as without one
        return url
    if not same or not (theirs.password or secret_params(theirs.query)):
        return url
    if theirs.password:
        ours = ours._replace(netloc=theirs.netloc)
    return ours._replace(query="&".join(filter(None, [ours.query, *secret_params(theirs.query)]))).geturl()


# libpq's TLS parameters, under the names the Postgres provider's connection extra and pgjdbc use too, and its
# server settings (`options`: `-c search_path=...`): what every client of the metadata database carries over
SSL_PARAMS = ("sslmode", "sslrootcert", "sslcert", "sslkey")
LIBPQ_PARAMS = SSL_PARAMS + ("options",)


def database_ssl_params(database_url: str) -> dict[str, str]:
    """libpq's TLS parameters of the database URL (`?sslmode=verify-full&sslrootcert=...`)."""
    return _query_params(database_url, SSL_PARAMS)


def database_libpq_params(database_url: str) -> dict[str, str]:
    """The URL's TLS parameters and `options`, for the clients that do not take the URL itself (Spark's JDBC
    reader: pgjdbc knows the same names; Airflow's connection extra)."""
    return _query_params(database_url, LIBPQ_PARAMS)


def _query_params(database_url: str, names: tuple[str, ...]) -> dict[str, str]:
    given = dict(parse_qsl(urlsplit(database_url).query))  # (the setting's check refuses a repeated one)
    return {k: given[k] for k in names if k in given}


# libpq's whole-number parameters: psycopg2 passes them on unchecked, and a word in one failed each command
# with a ValueError at its first connection instead of naming the setting
INTEGER_PARAMS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
                  "tcp_user_timeout")
_UNKNOWN_PARAM = re.compile(r'invalid URI query parameter: "([A-Za-z0-9_.-]{1,64})"')


def _check_libpq(url: str, scheme: str, params: list[tuple[str, str]]) -> None:
    """The URL as libpq parses it (its own parser, no connection): an unknown parameter or a malformed or NUL
    percent-encoding is a ConfigError naming the setting, never libpq's text, which quotes the value (a
    password's too)."""
    from psycopg2 import ProgrammingError
    from psycopg2.extensions import parse_dsn

    try:
        parse_dsn("postgresql" + url[len(scheme):])
    except ProgrammingError as exc:
        unknown = _UNKNOWN_PARAM.search(str(exc))
        raise ConfigError(f"TIERING_DATABASE_URL has a parameter libpq does not know: {unknown.group(1)}"
                          if unknown else "TIERING_DATABASE_URL is not a URL libpq accepts (a malformed or "
                          "NUL %-encoding, or a malformed host or port?)") from None
    bad = [k for k, v in params if k in INTEGER_PARAMS and not re.fullmatch(r"\s*-?\d{1,9}\s*", v)]
    if bad:
        raise ConfigError(f"TIERING_DATABASE_URL's {bad[0]} must be a whole number")
    ports = [v for k, v in params if k == "port"]
    if any(not p.isdigit() or not 0 < int(p) <= 65535 for v in ports for p in v.split(",")):
        raise ConfigError("TIERING_DATABASE_URL's port must be a whole number from 1 to 65535 (a list: one each)")


def checked_database_url(url: str) -> str:
    """TIERING_DATABASE_URL checked as a setting (ConfigError naming it), `postgres://` spelt `postgresql://`."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed IPv6 host ("postgresql://u@[::1/db")
        raise ConfigError("TIERING_DATABASE_URL must be a postgresql:// URL") from None
    if parts.scheme not in ("postgresql", "postgres", "postgresql+psycopg2") or not parts.hostname and not parts.path:
        raise ConfigError("TIERING_DATABASE_URL must be a postgresql:// URL")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ConfigError("TIERING_DATABASE_URL's port must be a whole number from 0 to 65535") from None
    params = parse_qsl(parts.query, keep_blank_values=True)
    names = [k for k, _ in params]
    repeated = sorted({k for k in names if names.count(k) > 1})
    if repeated:
        # libpq takes the last of a repeated parameter, SQLAlchemy and pyiceberg's catalog a tuple of all: one
        # value each, or the product's clients would disagree on which server settings (or TLS files) apply
        raise ConfigError(f"TIERING_DATABASE_URL gives {', '.join(repeated)} more than once: give each "
                          "parameter once (several server settings go in one options value: "
                          "options=-c%20a%3D1%20-c%20b%3D2)")
    _check_libpq(url, parts.scheme, params)
    sslmode = database_ssl_params(url).get("sslmode")
    if sslmode is not None and sslmode not in PG_SSLMODES:
        raise ConfigError(f"TIERING_DATABASE_URL's sslmode must be one of {', '.join(PG_SSLMODES)}")
    if parts.scheme == "postgres":
        url = "postgresql" + url[len("postgres"):]
    return url
