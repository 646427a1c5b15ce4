-- Run once by the postgres image's entrypoint, when its data volume is empty (first start).
-- The `tiering` database (POSTGRES_DB) holds the tiering schema; Airflow keeps its own metadata apart,
-- in `airflow`, owned by the same role (POSTGRES_USER).
CREATE DATABASE airflow;
