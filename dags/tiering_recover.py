"""
### Recover the metadata (manual)

After losing the database: rebuild topic, ledger and chunk rows from the bucket's index objects and the
tier-1 ledger files, one topic per Spark task (`tiering/jobs/recover.py`, the code of `tiering
recover-from-bucket`). Offloaded ledgers come back OFFLOADED; sealed ledgers only tier 1 holds come back
SEALED (open files are sealed first); every topic's next ledger id moves past its files. Topics are created
with the default policy: set policies afterwards. Idempotent: a rerun adds only what is missing. Trigger
with `topic` to recover one topic, with `check_pages` to also download every data object and check its
page CRC32Cs (the whole bucket). Stop the producers first: a ledger file still being written fails its
topic. Run `tiering db upgrade` on the new database before triggering.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_recover", __doc__)
