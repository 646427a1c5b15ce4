"""
### Defrag

Daily: merge runs of small offloaded ledgers of a topic into one data object and one index object
(UploadPartCopy for sources of at least 5 MiB, download-and-concatenate for smaller ones); the chunk rows
switch in one conditional transaction and the old objects go to GC after a delay. Optional `topic` param.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_defrag", __doc__)
