"""
### Sync topics into their Iceberg tables (hourly and after every offload)

For every topic with a table (`tiering topic set TOPIC --table NAMESPACE.TABLE`), appends each SEALED or
OFFLOADED ledger not yet in the table, exactly once (`tiering/jobs/table_sync.py`): Spark executors write
the Parquet data files from whichever tier holds each ledger, the driver commits them with pyiceberg to the
SQL catalog in the metadata database, and the table's snapshot summary names the ledgers of each commit.
A history is brought in by bounded rounds, each committed (a killed run resumes where it stopped); with
retention `follow`, ledgers retention or truncate deleted are deleted from the table too. The `plan` task
skips Spark when no topic has new ledgers. Trigger with `topic` to sync one topic.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_table_sync", __doc__)
