"""
### Metadata export

Daily: Spark reads the `tiering` tables over JDBC and writes a Parquet snapshot (one dataset per table and
a manifest, written last) to S3 or a path (`dest` param). `tiering import-metadata` restores it into an
empty schema. A `dest` under the tier-2 prefix (GC's orphan sweep owns it and would delete the export), or one
that is not a path or s3://bucket/path, fails the `plan` task once, its log ending at the sentence.
"""
from tiering.jobs.airflow_dags import build_dag

dag = build_dag("tiering_metadata_export", __doc__)
