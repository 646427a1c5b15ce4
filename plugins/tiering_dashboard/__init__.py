"""The tiering dashboard served by Airflow's API server (see tiering_plugin.py next to this package)."""
from tiering_dashboard.app import create_app, default_engine_factory

__all__ = ["create_app", "default_engine_factory"]
