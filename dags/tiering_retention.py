"""
### Retention

Hourly: truncate each topic's head by retention time and size (whole ledgers, never the open one;
Pravega PDP-19). Metadata first, then tier-1 files; tier-2 objects go to the GC queue. Trimmed ranges read
as `TRIMMED` gaps. Optional `topic` param.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_retention", __doc__)
