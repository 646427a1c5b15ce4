-- job_run says which kind of run it was (offload by age, by size, prefix, ...) and, for runs started by
-- Airflow, the DAG, run and try, so the dashboard can link each row to its Airflow run.
ALTER TABLE tiering.job_run
    ADD COLUMN kind        text,
    ADD COLUMN dag_id      text,
    ADD COLUMN dag_run_id  text,
    ADD COLUMN try_number  integer CHECK (try_number >= 0);
UPDATE tiering.job_run SET kind = job WHERE kind IS NULL;
CREATE INDEX job_run_dag_run ON tiering.job_run (dag_id, dag_run_id);
