"""
### Scrub every topic (weekly or manual, paused by default)

Reads every entry of every topic through the Spark data source `tiering` (`tiering/jobs/scrub.py`): each
ledger from the tier that holds it, every tier-2 page's CRC32C and every tier-1 payload's CRC checked, in
parallel (a Spark task per ledger or run of pages). The result, entries and bytes read, and any topic that
failed (a corrupt page names its object, page and offset; data loss names the ledger) is one `job_run` row
of kind `scrub`. It downloads all of tier 2, so the DAG is created paused: unpause it for the weekly run,
or trigger it with `topic` to scrub one topic, e.g. after a suspected disk or bucket problem.

Then the repair's check (`tiering repair`) of what the Spark read did not read from tier 2 counts the broken
tier-2 copies that are repairable from a verified tier-1 copy and those that are not (the run's details, the
dashboard's Integrity card). A run triggered by hand repairs them (Param `repair` empty; false: report
only), the scheduled run reports only (unless `repair` is true): a new object pair per broken copy, and
ledgers with no good copy left marked lost (read as DATALOSS gaps at once).
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_scrub", __doc__)
dag.is_paused_upon_creation = True  # reads the whole bucket: an operator turns it on
