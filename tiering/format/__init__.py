"""PIP-17 object formats (data blocks, index, ledger metadata, keys): pure functions on bytes, no I/O."""
from tiering.format.block import (BLOCK_MAGIC, DEFAULT_BLOCK_SIZE, ENTRY_HEADER_LEN, HEADER_LEN,
                                  MIN_BLOCK_SIZE, MIN_PACK_BLOCK_SIZE, PADDING, Block, BlockHeader,
                                  EndOfEntries, Entry, NeedMore, decode_block, encode_block_header,
                                  entries_size, iter_block_entries, parse_block_header, read_entry_at)
from tiering.format.packing import FramedRun, frame_entries, pack_blocks, pack_runs
from tiering.format.index import (INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_MAGIC, IndexEntry, OffloadIndex,
                                  decode_index, encode_index)
from tiering.format.keys import INDEX_SUFFIX, ParsedKey, data_key, encode_topic, index_key, parse_key
from tiering.format.metadata import (FORMAT_VERSION, FORMAT_VERSION_KEY, TOPIC_KEY, USER_METADATA,
                                     LedgerOffloadMetadata, check_user_metadata, decode_metadata,
                                     encode_metadata, user_metadata)

__all__ = [
    "BLOCK_MAGIC", "DEFAULT_BLOCK_SIZE", "ENTRY_HEADER_LEN", "HEADER_LEN", "MIN_BLOCK_SIZE",
    "MIN_PACK_BLOCK_SIZE", "PADDING", "Block", "BlockHeader", "EndOfEntries", "Entry", "NeedMore",
    "decode_block", "encode_block_header", "entries_size", "iter_block_entries", "parse_block_header",
    "read_entry_at", "FramedRun", "frame_entries", "pack_blocks", "pack_runs",
    "INDEX_ENTRY_LEN", "INDEX_HEADER_LEN", "INDEX_MAGIC", "IndexEntry", "OffloadIndex", "decode_index",
    "encode_index",
    "INDEX_SUFFIX", "ParsedKey", "data_key", "encode_topic", "index_key", "parse_key",
    "FORMAT_VERSION", "FORMAT_VERSION_KEY", "TOPIC_KEY", "USER_METADATA", "LedgerOffloadMetadata",
    "check_user_metadata", "decode_metadata", "encode_metadata", "user_metadata",
]
