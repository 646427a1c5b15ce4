"""
### Offload by age

Every 15 minutes: offload to S3 every sealed ledger sealed longer ago than its topic's `offload_after`
(`-1` never, `0` at once), in Pulsar's PIP-17 format, as a Spark job (`tiering/jobs/offload.py --by=age`).
Trigger with `topic` to limit a run to one topic. Attempts whose worker died are taken over after the
offload timeout. See `select * from tiering.offload_backlog`.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_offload_by_age", __doc__)
