"""The clients of one `tiering` invocation, each built once, on first use, from the environment (config.py is
the only reader of it). Heavy libraries (SQLAlchemy, boto3) are imported inside the properties on purpose:
`tiering --help` and a refused argument must not pay for them."""
from __future__ import annotations

from functools import cached_property

from tiering import clients
from tiering.config import Settings, setting_from_env, settings_present
from tiering.errors import ConfigError


class Context:
    @cached_property
    def settings(self) -> Settings:
        return Settings.from_env()

    @cached_property
    def database_url(self) -> str:
        """Only TIERING_DATABASE_URL: a command that reads the metadata alone needs no other setting (the
        bucket, tier 1 and the rest are read, and checked, by the first use of `settings`)."""
        return self.setting("database_url")

    @cached_property
    def _present(self) -> dict:
        return settings_present()

    def setting(self, name: str):
        """One setting: from the settings when they were read already, else from those that are set (every
        one of them checked; a required one that is not set is refused only when used)."""
        return getattr(self.settings, name) if "settings" in self.__dict__ else \
            setting_from_env(name, present=self._present)

    @cached_property
    def engine(self):
        from sqlalchemy.exc import ArgumentError  # heavy: see the module docstring

        from tiering.metadata.db import interruptible_waits, make_engine

        interruptible_waits()  # Ctrl-C ends a command waiting on PostgreSQL
        try:
            return make_engine(self.database_url)
        except (ArgumentError, ValueError):  # e.g. a port that is not a number; the message may hold the URL
            raise ConfigError("TIERING_DATABASE_URL is malformed: expected "
                              "postgresql://USER:PASSWORD@HOST:PORT/DATABASE") from None

    @cached_property
    def meta(self):
        engine = self.engine  # settings first: a configuration mistake is reported before heavy imports
        from tiering.metadata.repository import MetadataStore

        return MetadataStore(engine)

    @cached_property
    def tier1(self):
        from tiering.tier1 import Tier1Store

        return Tier1Store(self.setting("tier1_root"))

    @cached_property
    def bucket(self):
        return clients.bucket(self.settings)

    @cached_property
    def deps(self):
        from tiering.ops.context import Deps, Knobs

        return Deps(self.meta, self.tier1, self.bucket, Knobs.from_settings(self.settings))

    def check_topic(self, topic: str | None) -> None:
        """`--topic NAME` must name a topic (a misspelt name would otherwise quietly do nothing)."""
        if topic is not None:
            self.meta.get_topic(topic)

    def tier2_opener(self):
        """A ReadHandle's tier-2 opener that builds the S3 client on first use (a read that stays in tier 1
        never pays for it), then shares one cache and pool across ledgers."""
        opener = None

        def open_ledger(led, chunk):
            nonlocal opener
            if opener is None:
                from tiering.tier2.reader import tier2_opener as make

                opener = make(self.bucket)
            return opener(led, chunk)

        return open_ledger

    def read_handle(self, raise_on_dataloss: bool = False, opener=None):
        from tiering.read import ReadHandle

        return ReadHandle(self.meta, self.tier1, open_tier2=opener or self.tier2_opener(),
                          raise_on_dataloss=raise_on_dataloss, gc_delay_seconds=self.setting("gc_delay_seconds"))

    def close(self) -> None:
        if "engine" in self.__dict__:
            self.engine.dispose()
