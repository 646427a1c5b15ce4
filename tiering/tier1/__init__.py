"""Tier 1: local ledger storage under a root directory (write, seal, recover, read, delete)."""
from tiering.tier1.ledger_file import (LedgerFileExists, LedgerFileMissing, LedgerWriter, RecoveryInfo, SealInfo,
                                       fsync_dir, recover)
from tiering.tier1.ledger_reader import LedgerReader
from tiering.tier1.paths import ledger_path, topic_dir, topic_dir_name
from tiering.tier1.store import Tier1Store

__all__ = [
    "LedgerFileExists", "LedgerFileMissing", "LedgerReader", "LedgerWriter", "RecoveryInfo", "SealInfo",
    "Tier1Store", "fsync_dir", "ledger_path", "recover", "topic_dir", "topic_dir_name",
]
