"""
### Garbage collection

Hourly: delete due keys of the GC queue that nothing references (retries with backoff, `FAILED` after
5 attempts), sweep orphaned objects under the prefix and abort stale multipart uploads.
See `select * from tiering.gc_queue`.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_gc", __doc__)
