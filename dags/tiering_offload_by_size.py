"""
### Offload by size

Every 15 minutes: Pulsar's threshold rule — walk each topic's ledgers newest to oldest summing sizes
(offloaded ones included) and offload every ledger not yet offloaded once the sum exceeds the topic's
`offload_threshold_bytes` (`tiering/jobs/offload.py --by=size`). Optional `topic` param.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_offload_by_size", __doc__)
