"""Spark applications of the pipeline: plan in the driver with SQL, do the per-item work on executors."""
