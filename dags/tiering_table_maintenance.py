"""
### Maintain the topics' Iceberg tables (daily)

For every topic whose table exists (`tiering/jobs/table_maintenance.py`): each partition's small data files
are compacted into one file (one overwrite commit by ledger id, refused and left alone if a sync committed
meanwhile), and snapshots older than 7 days are expired (never the current one). The work is pyiceberg's on
the driver; Spark is not started. Trigger with `topic` to maintain one table.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_table_maintenance", __doc__)
