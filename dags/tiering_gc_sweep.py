"""
### Orphan sweep

Daily: list the tier-2 prefix from where the last sweep stopped (a cursor in `tiering.gc_sweep`), up to
10,000 pages of 1,000 keys, and delete objects no chunk references and no GC task holds, older than the
grace period (2 h). Each page is listed first and decided on one database snapshot taken after the listing.
At the end of the prefix the cursor wraps round (a pass completed). A sweep started while another runs
ends at once, successfully, saying so. By hand: `tiering gc --sweep [--max-pages N]`.
See `select * from tiering.gc_sweep`.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_gc_sweep", __doc__)
