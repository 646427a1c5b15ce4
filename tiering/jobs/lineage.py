"""OpenLineage of the DAGs' tasks: the datasets a run reads and writes, and what it moved.

The OpenLineage provider's listener emits the events (START, COMPLETE, FAIL) through its configured
transport and calls the operators' `get_openlineage_facets_on_start/complete/failure`, which come from
`LineageMixin` here; with no transport configured the provider is disabled and none of this runs. Datasets:

- a topic: namespace `tiering://<database host>/<database>`, name the topic;
- its tier-2 objects: namespace `s3://<bucket>`, name `<prefix><topic>` (the bucket's whole prefix for GC);
- a metadata export's location (`s3://<bucket>` + key prefix, or `file` + directory) and the metadata tables
  it read (`postgres://<host>:<port>`, `<database>.tiering.<table>`);
- datasets a job names itself in its job_run row (`details["lineage"]`: an Iceberg table a job writes).

What moved comes from the job_run row the Spark job wrote (`details["moved"]`: per topic, ledgers, entries
and the ledger-id range; tiering.jobs.runner). Nothing here holds a secret: URLs lose their user and
password, and no setting but the bucket, prefix and database host and name is read.
"""
from __future__ import annotations

from functools import cache
from typing import Any, Mapping
from urllib.parse import parse_qs, urlsplit

FACET = "tiering"  # the run facet's key in an event
# a custom facet names its own schema; this one is described in the README (Lineage)
SCHEMA_URL = "urn:tiering:openlineage:TieringRunFacet:1"
# Per kind of run (job_run.kind: JobSpec.kind, the offload DAGs' three kinds): what it reads and writes.
# "topic": the topics' metadata and tier-1 ledgers; "tier2": their tier-2 objects; "bucket": the whole
# tier-2 prefix; "export": the export's location; "tables": the metadata tables.
ROLES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "offload_by_age": (("topic",), ("tier2",)),
    "offload_by_size": (("topic",), ("tier2",)),
    "offload_prefix": (("topic",), ("tier2",)),
    "delete_lagged": (("tier2",), ("topic",)),  # a tier-1 copy goes once its tier-2 copy is old enough
    "retention": (("topic",), ("topic", "tier2")),
    "defrag": (("tier2",), ("tier2",)),
    "gc": ((), ("bucket",)),
    "gc_sweep": (("bucket",), ("bucket",)),
    "recover": (("tier2",), ("topic",)),
    "export_metadata": (("tables",), ("export",)),
    "scrub": (("topic", "tier2"), ()),
    # the tables themselves come from the run's row (details["lineage"]), which knows the identifiers
    "table_sync": (("topic",), ()),
    "table_maintenance": ((), ()),
}
DEFAULT_ROLES: tuple[tuple[str, ...], tuple[str, ...]] = (("topic",), ())


def enabled() -> bool:
    """Whether the OpenLineage provider emits at all (a transport, config file or URL is configured)."""
    try:
        from airflow.providers.openlineage import conf
    except ImportError:
        return False
    return not conf.is_disabled()


def _host_db(database_url: str) -> tuple[str, int | None, str]:
    """(host, port, database) of a SQLAlchemy/libpq URL; never its user or password."""
    parts = urlsplit(database_url)
    host = parts.hostname or (parse_qs(parts.query).get("host") or ["localhost"])[0]
    try:
        port = parts.port
    except ValueError:  # not a number: not ours to judge here
        port = None
    return host, port, parts.path.lstrip("/") or "postgres"


def topic_namespace(database_url: str) -> str:
    host, port, db = _host_db(database_url)
    return f"tiering://{host}{f':{port}' if port and port != 5432 else ''}/{db}"


def tables_namespace(database_url: str) -> tuple[str, str]:
    """(namespace, database) of the metadata tables, in OpenLineage's PostgreSQL naming."""
    host, port, db = _host_db(database_url)
    return f"postgres://{host}:{port or 5432}", db


def location_dataset(location: str) -> tuple[str, str]:
    """(namespace, name) of an export location: s3://bucket/key... or a local directory."""
    parts = urlsplit(location)
    if parts.scheme in ("s3", "s3a"):
        return f"s3://{parts.hostname or parts.netloc.rpartition('@')[2]}", parts.path.lstrip("/")
    return "file", parts.path if parts.scheme == "file" else location


def datasets(kind: str, settings, topics: list[str], details: Mapping[str, Any] | None = None,
             dest: str | None = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(inputs, outputs) of a run of `kind` over `topics`, as (namespace, name) pairs. `settings`: anything
    with database_url, bucket and prefix (tiering.config.Settings)."""
    details = details or {}
    dest = details.get("dest") or dest

    def of(role: str) -> list[tuple[str, str]]:
        if role == "topic":
            return [(topic_namespace(settings.database_url), t) for t in topics]
        if role == "tier2":
            return [(f"s3://{settings.bucket}", f"{settings.prefix}{t}") for t in topics]
        if role == "bucket":
            return [(f"s3://{settings.bucket}", settings.prefix)]
        if role == "export":
            return [location_dataset(dest)] if isinstance(dest, str) and dest else []
        if role == "tables":
            ns, db = tables_namespace(settings.database_url)
            schemas = details.get("schemas") or {}  # the catalog's tables sit where the search_path put them
            return [(ns, f"{db}.{schemas.get(t, 'tiering')}.{t}") for t in sorted(details.get("tables") or {})]
        raise ValueError(role)

    ins, outs = ROLES.get(kind, DEFAULT_ROLES)
    if details.get("dry_run"):  # a preview reads what its run would and writes nothing
        outs = ()
    named = details.get("lineage") or {}
    return ([d for r in ins for d in of(r)] + _named(named.get("inputs")),
            [d for r in outs for d in of(r)] + _named(named.get("outputs")))


def _named(items) -> list[tuple[str, str]]:
    return [(str(i["namespace"]), str(i["name"])) for i in items or ()
            if isinstance(i, Mapping) and i.get("namespace") and i.get("name")]


def topics_of(params: Mapping[str, Any], details: Mapping[str, Any] | None = None) -> list[str]:
    """The topics a run touched: those its row says it moved, else the run's topic parameter."""
    moved = (details or {}).get("moved") or {}
    if moved:
        return sorted(moved)
    topic = params.get("topic")
    return [topic] if isinstance(topic, str) and topic else []


def run_summary(row: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run facet's fields from a job_run row: its id, status, counts, bytes and, where the job moved
    ledgers, their count, entries and id range in all and per topic."""
    if not row:
        return {}
    details = row.get("details") or {}
    moved = details.get("moved") or {}
    out: dict[str, Any] = {"jobRunId": row.get("run_id"), "status": row.get("status"),
                           "itemsDone": row.get("items_done"), "itemsFailed": row.get("items_failed"),
                           "itemsSkipped": details.get("skipped", 0), "bytes": row.get("bytes")}
    if moved:
        out.update(ledgers=sum(m["ledgers"] for m in moved.values()),
                   entries=sum(m["entries"] for m in moved.values()),
                   firstLedgerId=min(m["first_ledger"] for m in moved.values()),
                   lastLedgerId=max(m["last_ledger"] for m in moved.values()),
                   topics={t: {"ledgers": m["ledgers"], "entries": m["entries"],
                               "firstLedgerId": m["first_ledger"], "lastLedgerId": m["last_ledger"]}
                           for t, m in sorted(moved.items())})
    elif "entries" in details:  # the scrub reads entries without moving ledgers
        out["entries"] = details["entries"]
    if details.get("dry_run"):
        out["dryRun"] = True
    if row.get("error"):
        out["error"] = str(row["error"])[:2000]
    return {k: v for k, v in out.items() if v is not None}


def operator_lineage(kind: str, settings, params: Mapping[str, Any], row: Mapping[str, Any] | None = None,
                     extra: Mapping[str, Any] | None = None):
    """The provider's OperatorLineage of one task: its datasets, the tier-2 outputs' statistics (entries
    per topic, bytes when there is one topic) and the `tiering` run facet (the job_run row, `extra`)."""
    from airflow.providers.openlineage.extractors import OperatorLineage
    from openlineage.client.event_v2 import InputDataset, OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset

    details = (row or {}).get("details") or {}
    topics = topics_of(params, details)
    ins, outs = datasets(kind, settings, topics, details, params.get("dest"))
    moved = details.get("moved") or {}
    prefix = f"s3://{settings.bucket}"

    def out_facets(ns: str, name: str) -> dict:
        topic = name.removeprefix(settings.prefix) if ns == prefix else None
        if topic in moved:
            size = row.get("bytes") if len(moved) == 1 else None
            return {"outputStatistics": output_statistics_output_dataset.OutputStatisticsOutputDatasetFacet(
                rowCount=moved[topic]["entries"], size=size)}
        return {}

    facet = _facet_class()(**{**run_summary(row), **(extra or {})})
    return OperatorLineage(inputs=[InputDataset(namespace=ns, name=n) for ns, n in ins],
                           outputs=[OutputDataset(namespace=ns, name=n, outputFacets=out_facets(ns, n))
                                    for ns, n in outs],
                           run_facets={FACET: facet} if (row or extra) else {})


@cache  # defined on first use: importing this module at DAG parse time loads no OpenLineage code
def _facet_class():
    import attr
    from openlineage.client.facet_v2 import RunFacet as Base

    @attr.define
    class TieringRunFacet(Base):
        """What a run of the pipeline did, from its job_run row (see the module's doc)."""
        jobRunId: int | None = attr.field(default=None)  # noqa: N815 - OpenLineage's camelCase
        status: str | None = attr.field(default=None)
        itemsDone: int | None = attr.field(default=None)  # noqa: N815
        itemsFailed: int | None = attr.field(default=None)  # noqa: N815
        itemsSkipped: int | None = attr.field(default=None)  # noqa: N815
        bytes: int | None = attr.field(default=None)
        ledgers: int | None = attr.field(default=None)
        entries: int | None = attr.field(default=None)
        firstLedgerId: int | None = attr.field(default=None)  # noqa: N815
        lastLedgerId: int | None = attr.field(default=None)  # noqa: N815
        topics: dict | None = attr.field(default=None)
        error: str | None = attr.field(default=None)
        planned: int | None = attr.field(default=None)
        sparkStarted: bool | None = attr.field(default=None)  # noqa: N815

        @staticmethod
        def _get_schema() -> str:
            return SCHEMA_URL

    return TieringRunFacet


def job_run_row(dag_id: str, dag_run_id: str, try_number: int | None) -> tuple[Any, dict | None]:
    """(settings, the job_run row of this Airflow run and try) from the tiering connections."""
    from tiering import clients
    from tiering.jobs.hook import TieringHook
    from tiering.metadata.job_runs import JobRuns

    settings = TieringHook().get_settings()
    engine = clients.engine(settings, pool_size=1)
    try:
        return settings, JobRuns(engine).by_airflow_run(dag_id, dag_run_id, try_number)
    finally:
        engine.dispose()


class LineageMixin:
    """`get_openlineage_facets_on_start/complete/failure` of a tiering DAG's task, which the provider's
    listener calls when it is enabled (never otherwise: lineage off costs nothing). `lineage_job` is the DAG's
    id in tiering.jobs.spec.JOBS; `lineage_topic` is a template field ("{{ params.get('topic') or '' }}") rendered
    before START, so START names the run's topic before the task has run. `lineage_extra` is what the task
    itself adds to the run facet (the plan task: planned items, whether Spark starts)."""

    lineage_job: str = ""
    lineage_topic: str = ""
    lineage_extra: dict | None = None

    def _lineage(self, task_instance):
        from tiering.jobs.spec import JOBS

        kind = JOBS[self.lineage_job].kind
        params = {"topic": self.lineage_topic or None}
        row = None
        if task_instance is not None:
            settings, row = job_run_row(task_instance.dag_id, task_instance.run_id, task_instance.try_number)
        else:
            from tiering.jobs.hook import TieringHook

            settings = TieringHook().get_settings()
        return operator_lineage(kind, settings, params, row, self.lineage_extra)

    def get_openlineage_facets_on_start(self):
        return self._lineage(None)

    def get_openlineage_facets_on_complete(self, task_instance):
        return self._lineage(task_instance)

    def get_openlineage_facets_on_failure(self, task_instance):
        return self._lineage(task_instance)
