"""A topic as an Apache Iceberg table: every sealed ledger appended exactly once (sync.py), with pyiceberg's
SQL catalog in the metadata database and Parquet data files under `s3://<bucket>/<prefix>-tables/`."""
