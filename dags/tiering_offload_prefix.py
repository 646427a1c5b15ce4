"""
### offloadPrefix (manual)

Pulsar's `offloadPrefix`: offload every sealed ledger of `topic` before the position `L:E` (ledger:entry).
Already-offloaded and empty ledgers are skipped; a ledger that fails does not stop the others and fails
the run at the end. Trigger from the form (Trigger DAG ▸ topic, position), from the CLI
(`airflow dags trigger tiering_offload_prefix --conf '{"topic": "orders", "position": "12:0"}'`) or from
the REST API (`POST /api/v2/dags/tiering_offload_prefix/dagRuns`). A bad position is refused by the form.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_offload_prefix", __doc__)
