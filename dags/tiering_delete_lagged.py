"""
### Delete lagged tier-1 copies

Hourly, and after every offload run that moved something (it follows the Asset `tiering_offload`,
`tiering://work/offload`, which the offload DAGs' Spark task updates): delete the tier-1 copy of every ledger offloaded longer ago than its topic's deletion lag (4 h by
default), file first, then metadata; readers in flight fall back to tier 2. Optional `topic` param.
See `select * from tiering.lagged_copies`.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_delete_lagged", __doc__)
