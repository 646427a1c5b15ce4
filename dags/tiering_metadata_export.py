"""
### Metadata export

Daily: Spark reads the `tiering` tables over JDBC and writes a Parquet snapshot (one dataset per table and
a manifest, written last) to S3 or a path (`dest` param). `tiering import-metadata` restores it into an
empty schema.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_metadata_export", __doc__)
