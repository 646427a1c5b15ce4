"""The tiering dashboard as a FastAPI app, mounted by Airflow's API server under /tiering (see
plugins/tiering_plugin.py): a read-only JSON API over the metadata views and one HTML page that charts it.

    /tiering/                       the dashboard (HTML; its script and style under /tiering/static/)
    /tiering/api/topics             topics, their policy (subscription policy too) and ledger counts per state
    /tiering/api/tier-usage         bytes and ledgers per tier per topic (view tiering.tier_usage)
    /tiering/api/offload-backlog    sealed ledgers not yet offloaded (view tiering.offload_backlog)
    /tiering/api/lagged-copies      tier-1 copies waiting for their deletion lag (view tiering.lagged_copies)
    /tiering/api/integrity          ledgers marked lost (no good copy in any tier) and the newest scrub's
                                    repairable / unrepairable tier-2 copies
    /tiering/api/gc-queue           GC queue by state and reason, due count, next tasks (view tiering.gc_queue)
    /tiering/api/job-runs?limit=50  recent pipeline runs (table tiering.job_run)
    /tiering/api/subscriptions?limit=100  subscriptions, largest backlog first: position, state, backlog
                                    (sealed ledgers), entries/bytes deleted unread, last loss; totals
    /tiering/api/series?hours=24&step_minutes=60   offloaded bytes and backlog over time
    /tiering/metrics                Prometheus metrics (text exposition format; tiering/metrics.py)

Only GET routes exist. The database is reached through the Airflow connection `tiering_metadata` with an
engine built on the first request and cached (nothing connects at import); every transaction is read-only.
An unreachable database or a missing connection answers 503 with a one-line message and no secrets. The API
requires an Airflow login (the UI's session cookie or an API bearer token), like Airflow's own API.

/metrics is for Prometheus, which cannot log in to Airflow (its tokens expire): when the environment names a
token file (TIERING_METRICS_TOKEN_FILE, read on each scrape so it can be rotated), a request bearing that
token is let in (compared in constant time); an Airflow login is accepted too. Without the setting, /metrics
wants an Airflow login like the API.
"""
from __future__ import annotations

import hmac
import html
import logging
import os
import threading
from importlib import resources
from typing import Callable

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

from tiering import dashboard as queries
from tiering.metrics import TieringCollector

log = logging.getLogger(__name__)

CONN_ID = "tiering_metadata"
METRICS_TOKEN_FILE_VAR = "TIERING_METRICS_TOKEN_FILE"
EngineFactory = Callable[[], Engine]
_STATIC = resources.files(__package__) / "static"
_SECURITY_HEADERS = {
    # Everything comes from this app: no CDN, no inline script, framed only by Airflow's UI (same origin).
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; frame-ancestors 'self'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class Unavailable(Exception):
    """The metadata database cannot answer; the message is one line and safe to show."""


def default_engine_factory() -> Engine:
    """A read-only engine from the Airflow connection `tiering_metadata` (resolved through Airflow's secrets
    backends: environment AIRFLOW_CONN_*, the metastore, or a configured backend)."""
    from airflow.sdk import BaseHook  # imported here: importing the plugin does no Airflow lookups

    from tiering.jobs.hook import TieringHook

    try:
        conn = BaseHook.get_connection(CONN_ID)
    except Exception as exc:  # AirflowNotFoundException, or a secrets backend failing
        raise Unavailable(f"the Airflow connection {CONN_ID!r} is not defined or cannot be read "
                          f"({type(exc).__name__})") from None
    if (conn.conn_type or "postgres") not in ("postgres", "postgresql"):
        raise Unavailable(f"the Airflow connection {CONN_ID!r} must be of type postgres, not {conn.conn_type!r}")
    return queries.make_read_only_engine(TieringHook.database_url(conn))


class _LazyEngine:
    """Builds the engine on first use and keeps it; a failed build is retried on the next request."""

    def __init__(self, factory: EngineFactory):
        self.factory = factory
        self._engine: Engine | None = None
        self._lock = threading.Lock()

    def get(self) -> Engine:
        if self._engine is None:
            with self._lock:
                if self._engine is None:
                    try:
                        self._engine = self.factory()
                    except Unavailable:
                        raise
                    except Exception as exc:
                        log.warning("tiering dashboard: cannot build the metadata engine: %s", type(exc).__name__)
                        raise Unavailable(f"cannot build the metadata database engine ({type(exc).__name__})") from None
        return self._engine

    def dispose(self) -> None:
        with self._lock:
            if self._engine is not None:
                self._engine.dispose()
                self._engine = None


def _database_error(exc: SQLAlchemyError) -> Unavailable:
    orig = getattr(exc, "orig", None)
    kind = type(orig).__name__ if orig is not None else type(exc).__name__
    pgcode = getattr(orig, "pgcode", None)
    # Logged by class and SQLSTATE only: driver messages name hosts and users, and the engine hides
    # statement parameters anyway.
    log.warning("tiering dashboard: metadata query failed: %s (SQLSTATE %s)", kind, pgcode)
    if pgcode == "57014":
        return Unavailable("the metadata query timed out")
    if pgcode in ("42P01", "3F000"):
        return Unavailable("the tiering schema or its views are missing: run `tiering db upgrade`")
    if kind == "OperationalError" or (isinstance(exc, DBAPIError) and exc.connection_invalidated):
        return Unavailable(f"the metadata database is unreachable ({kind})")
    return Unavailable(f"the metadata query failed ({kind})")


async def require_login(request: Request) -> None:
    """An authenticated Airflow user: bearer token (API clients) or the UI's session cookie (browsers)."""
    # Imported on use: only the API server, which has an auth manager, ever serves this app.
    from airflow.api_fastapi.auth.managers.base_auth_manager import COOKIE_NAME_JWT_TOKEN
    from airflow.api_fastapi.core_api.security import resolve_user_from_token

    header = request.headers.get("authorization", "")
    scheme, _, credentials = header.partition(" ")
    token = credentials.strip() if scheme.lower() == "bearer" else request.cookies.get(COOKIE_NAME_JWT_TOKEN)
    request.state.tiering_user = await resolve_user_from_token(token)


def _metrics_token(path: str) -> bytes:
    """The token in `path` (surrounding whitespace dropped). Unreadable or empty: no request matches it."""
    try:
        with open(path, "rb") as f:
            token = f.read().strip()
    except OSError as exc:
        log.warning("tiering metrics: cannot read %s: %s", METRICS_TOKEN_FILE_VAR, type(exc).__name__)
        return b""
    return token


def metrics_guard(token_file: str | None, login_required: bool):
    """The check in front of /metrics: the bearer token of `token_file`, else an Airflow login."""
    async def guard(request: Request) -> None:
        if token_file:
            scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
            token = _metrics_token(token_file)
            given = credentials.strip().encode()
            # constant time: the comparison does not tell how much of a guess was right
            if token and scheme.lower() == "bearer" and hmac.compare_digest(given, token):
                return
        if login_required:
            await require_login(request)
        elif token_file:
            raise HTTPException(401, "a bearer token is required", headers={"WWW-Authenticate": "Bearer"})
    return guard


def _static(name: str) -> str:
    return (_STATIC / name).read_text(encoding="utf-8")


def create_app(engine_factory: EngineFactory | None = None, *, login_required: bool = True,
               metrics_token_file: str | None = None) -> FastAPI:
    """The dashboard app. `engine_factory` returns the engine (default: from the Airflow connection
    `tiering_metadata`); it is called on the first request that needs the database, not here.
    `metrics_token_file` (default: $TIERING_METRICS_TOKEN_FILE) holds the bearer token /metrics accepts."""
    engine = _LazyEngine(engine_factory or default_engine_factory)
    if metrics_token_file is None:
        metrics_token_file = os.environ.get(METRICS_TOKEN_FILE_VAR) or None
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TieringCollector(engine.get))
    guard = [Depends(require_login)] if login_required else []
    app = FastAPI(title="Tiering dashboard", description=__doc__, docs_url=None, redoc_url=None,
                  openapi_url="/api/openapi.json")
    app.state.engine = engine

    @app.exception_handler(Unavailable)
    async def _unavailable(request: Request, exc: Unavailable) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=503, headers={"Cache-Control": "no-store"})

    def read(fn, *args):
        try:
            with engine.get().connect() as conn:
                return fn(conn, *args)
        except SQLAlchemyError as exc:
            raise _database_error(exc) from None

    @app.middleware("http")
    async def _headers(request: Request, call_next):
        response = await call_next(request)
        for key, value in _SECURITY_HEADERS.items():
            response.headers.setdefault(key, value)
        return response

    # -- the page (no data in it: the script fetches the API, which checks the login) --
    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    def index(request: Request) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/") + "/"
        page = _static("index.html").replace("__BASE__", html.escape(base, quote=True))
        return HTMLResponse(page)

    @app.get("/static/dashboard.js", include_in_schema=False)
    def script() -> Response:
        return Response(_static("dashboard.js"), media_type="text/javascript; charset=utf-8")

    @app.get("/static/dashboard.css", include_in_schema=False)
    def style() -> Response:
        return Response(_static("dashboard.css"), media_type="text/css; charset=utf-8")

    # -- the JSON API --
    @app.get("/api/topics", dependencies=guard)
    def topics():
        return read(queries.topics)

    @app.get("/api/tier-usage", dependencies=guard)
    def tier_usage():
        return read(queries.tier_usage)

    @app.get("/api/offload-backlog", dependencies=guard)
    def offload_backlog(limit: int = Query(100, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.offload_backlog, limit)

    @app.get("/api/lagged-copies", dependencies=guard)
    def lagged_copies(limit: int = Query(100, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.lagged_copies, limit)

    @app.get("/api/integrity", dependencies=guard)
    def integrity(limit: int = Query(100, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.integrity, limit)

    @app.get("/api/gc-queue", dependencies=guard)
    def gc_queue(limit: int = Query(20, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.gc_queue, limit)

    @app.get("/api/job-runs", dependencies=guard)
    def job_runs(limit: int = Query(50, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.job_runs, limit)

    @app.get("/api/subscriptions", dependencies=guard)
    def subscriptions(limit: int = Query(100, ge=1, le=queries.MAX_LIMIT)):
        return read(queries.subscriptions, limit)

    @app.get("/api/series", dependencies=guard)
    def series(hours: int = Query(24, ge=1, le=24 * 31), step_minutes: int = Query(60, ge=1, le=24 * 60)):
        if -(-hours * 60 // step_minutes) > queries.MAX_SERIES_POINTS:
            return JSONResponse({"detail": f"at most {queries.MAX_SERIES_POINTS} points: raise step_minutes"},
                                status_code=422)
        return read(queries.series, hours, step_minutes)

    # -- Prometheus --
    @app.get("/metrics", include_in_schema=False,
             dependencies=[Depends(metrics_guard(metrics_token_file, login_required))])
    def metrics() -> Response:
        try:
            body = generate_latest(registry)
        except SQLAlchemyError as exc:
            raise _database_error(exc) from None
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return app
