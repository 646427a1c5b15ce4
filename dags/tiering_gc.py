"""
### Garbage collection

Hourly: delete due keys of the GC queue that nothing references (retries with backoff, `FAILED` after
5 attempts) and abort stale multipart uploads. Its cost follows the queue, not the bucket: when nothing is
due the plan task skips Spark. Orphaned objects are the daily `tiering_gc_sweep`'s.
See `select * from tiering.gc_queue`.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_gc", __doc__)
