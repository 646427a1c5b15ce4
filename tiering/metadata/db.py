"""Engine construction and error mapping (no environment reads: the URL is passed in)."""
from __future__ import annotations

from sqlalchemy import create_engine
from sqlalchemy.engine import Engine


def make_engine(url: str, pool_size: int = 5, **kwargs) -> Engine:
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg2://" + url[len("postgresql://"):]
    # hide_parameters: a failed statement's parameters never reach logs or exceptions.
    return create_engine(url, pool_size=pool_size, pool_pre_ping=True, hide_parameters=True, **kwargs)
