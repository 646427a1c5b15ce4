"""A tiered append-only log store: tier-1 ledgers, PIP-17 offload to S3, PostgreSQL metadata."""

__version__ = "0.1.0"
