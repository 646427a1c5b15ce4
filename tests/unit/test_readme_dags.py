"""The README's DAG table (under "The pipeline under Airflow") is the one place the DAGs are listed for a
reader: it names exactly the DAGs of `jobs.spec.JOBS`, each with its schedule, its Spark application and
every run parameter its trigger form takes; no other document repeats the table (a copy drifted before)."""
import re
from pathlib import Path

from tests.unit.test_readme_config import readme_rows
from tiering.jobs.spec import JOBS

ROOT = Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\| `(tiering_[a-z_0-9]+)` \| ([^|]+) \| ([^|]+) \| (.+) \|$")
SCHEDULES = {"*/15 * * * *": "every 15 min", "@hourly": "hourly", "@daily": "daily", "@weekly": "weekly",
             None: "manual"}


def readme_dags() -> dict[str, tuple[str, str, str]]:
    return {dag_id: (m.group(2).strip(), m.group(3).strip(), m.group(4))
            for dag_id, m in readme_rows("### The pipeline under Airflow", ROW, "DAG").items()}


def test_the_readme_lists_every_dag_with_its_schedule_application_and_params():
    rows = readme_dags()
    assert sorted(rows) == sorted(JOBS), "the README's DAG table and jobs.spec.JOBS list different DAGs"
    for dag_id, spec in JOBS.items():
        schedule, application, does = rows[dag_id]
        assert schedule.startswith(SCHEDULES[spec.schedule]), (dag_id, schedule, spec.schedule)
        assert f"tiering/jobs/{spec.application}" in application, (dag_id, application)
        for flag in spec.fixed_args:
            assert flag in application, (dag_id, flag)
        for param in spec.params:
            if param.name not in ("topic", "position"):  # every topic-wide DAG takes a topic
                assert f"`{param.name}`" in does, f"the README's row of {dag_id} does not name its Param {param.name}"


def test_no_other_document_repeats_the_dag_table():
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        lines = [line for line in path.read_text(encoding="utf-8").splitlines() if ROW.match(line)]
        assert path.name == "README.md" or not lines, f"{path.name} repeats rows of the README's DAG table"
