"""Airflow plugin: the tiering dashboard (a FastAPI app under /tiering on the API server) and its link in
the UI's navigation (Browse > Tiering dashboard, shown inside the UI at /plugin/tiering-dashboard).

Importing this module builds the app object only: no database or connection lookup happens before the
first request (see tiering_dashboard/app.py).
"""
from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin

from tiering_dashboard import create_app

app = create_app()


class TieringPlugin(AirflowPlugin):
    name = "tiering"
    fastapi_apps = [{"app": app, "url_prefix": "/tiering", "name": "Tiering"}]
    external_views = [{
        "name": "Tiering dashboard",
        "href": "/tiering/",
        "destination": "nav",
        "category": "browse",
        "url_route": "tiering-dashboard",
    }]
