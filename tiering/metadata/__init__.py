"""PostgreSQL metadata (schema `tiering`) through SQLAlchemy Core: migrations and conditional updates."""
from tiering.metadata.db import make_engine
from tiering.metadata.migrations import upgrade

__all__ = ["make_engine", "upgrade"]
