"""Tier 2: S3 through boto3 — the PIP-17 offloader, the offloaded-ledger reader, object housekeeping."""
