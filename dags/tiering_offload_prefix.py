"""
### offloadPrefix (manual)

Pulsar's `offloadPrefix`: offload every sealed ledger of `topic` before the position `L:E` (ledger:entry),
or every sealed ledger of it with the position `all`. Already-offloaded and empty ledgers are skipped; a ledger that fails does not stop the others and fails
the run at the end. Trigger from the form (Trigger DAG ▸ topic, position), from the CLI
(`airflow dags trigger tiering_offload_prefix --conf '{"topic": "orders", "position": "12:0"}'`) or from
the REST API (`POST /api/v2/dags/tiering_offload_prefix/dagRuns`). A bad position (not two whole numbers
joined by a colon, nor `all`) is refused when the run is triggered (HTTP 400; the form shows the server's message,
which quotes that rule): no run is created. A topic that does not exist fails the `plan` task once, its
log ending at the sentence; the plan log counts ledgers and the batches they travel in.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_offload_prefix", __doc__)
