"""Data-aware scheduling: the Spark task of every DAG updates the Asset of its kind of work, the
three offload DAGs one shared Asset, and tiering_delete_lagged runs on that Asset or on its hourly cron."""
from __future__ import annotations

from tests.dags.test_dagbag import dagbag  # noqa: F401 - the fixture


def test_offload_dags_update_one_asset_and_delete_lagged_follows_it(dagbag):  # noqa: F811
    from airflow.sdk import AssetOrTimeSchedule

    uris = {}
    for dag_id, dag in dagbag.dags.items():
        spark = [t for t in dag.tasks if t.task_id != "plan"]
        assert len(spark) == 1 and not dag.get_task("plan").outlets, dag_id
        (asset,) = spark[0].outlets
        uris[dag_id] = asset.uri
    offload = {uris[d] for d in ("tiering_offload_by_age", "tiering_offload_by_size", "tiering_offload_prefix")}
    assert offload == {"tiering://work/offload"}
    assert len(set(uris.values())) == len(uris) - 2  # every other kind of work its own
    timetable = dagbag.dags["tiering_delete_lagged"].timetable
    assert isinstance(timetable, AssetOrTimeSchedule)
    assert timetable.asset_condition.uri == "tiering://work/offload"
    assert timetable.timetable._expression == "0 * * * *", timetable.timetable._expression
    assert all(not isinstance(d.timetable, AssetOrTimeSchedule) for i, d in dagbag.dags.items()
               if i not in ("tiering_delete_lagged", "tiering_table_sync"))
