"""Ledger offload metadata (protobuf in the index object) and the objects' S3 user metadata."""
from __future__ import annotations

import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

from tiering.errors import BadInput, CorruptObjectError
from tiering.format import (FORMAT_VERSION, FORMAT_VERSION_KEY, TOPIC_KEY, USER_METADATA, LedgerOffloadMetadata,
                            check_user_metadata, decode_metadata, encode_metadata, user_metadata)
from tiering.format import ledger_metadata_pb2 as pb
from tiering.format.metadata import PageIndex

FORMAT_DIR = Path(__file__).resolve().parents[2] / "tiering" / "format"

META = LedgerOffloadMetadata(topic="persistent://tenant/ns/topic-é", ledger_id=2**40, entry_count=50_000,
                             length=123_456_789, sealed_time_ms=1_700_000_000_123, offload_uuid="u-1",
                             data_object_len=2**33, block_size=64 << 20, properties={"b": "2", "a": "1"})


def test_round_trip():
    assert decode_metadata(encode_metadata(META)) == META
    assert META.last_entry_id == 49_999 and META.format_version == FORMAT_VERSION == 1


def test_encoding_is_deterministic():
    again = dataclasses.replace(META, properties={"a": "1", "b": "2"})
    assert encode_metadata(META) == encode_metadata(again)


def test_wire_format_is_the_proto_message():
    msg = pb.LedgerOffloadMetadata.FromString(encode_metadata(META))
    assert (msg.format_version, msg.topic, msg.ledger_id, msg.block_size) == (1, META.topic, 2**40, 64 << 20)
    assert dict(msg.properties) == {"a": "1", "b": "2"}
    assert pb.LedgerOffloadMetadata.DESCRIPTOR.full_name == "tiering.format.LedgerOffloadMetadata"


@pytest.mark.parametrize("change", [dict(ledger_id=-1), dict(entry_count=-1), dict(length=-5),
                                    dict(block_size=2**31), dict(data_object_len=2**63), dict(topic=""),
                                    dict(offload_uuid=""), dict(format_version=2), dict(ledger_id="1"),
                                    dict(properties={"a": 1}), dict(topic="\udc80")])
def test_encode_rejects_bad_fields(change):
    with pytest.raises(BadInput):
        encode_metadata(dataclasses.replace(META, **change))


@pytest.mark.parametrize("raw", [b"\xff", b"\x0a\x05ab", b"\x12\x02\xc3\x28", b"\x08"])
def test_decode_garbage_is_corrupt(raw):
    with pytest.raises(CorruptObjectError) as info:
        decode_metadata(raw, "idx, offset 32")
    assert info.value.what == "ledger metadata" and info.value.where == "idx, offset 32"


def test_decode_checks_the_values():
    bad = pb.LedgerOffloadMetadata(format_version=1, topic="t", offload_uuid="u", ledger_id=-3).SerializeToString()
    with pytest.raises(CorruptObjectError, match="ledger_id must be non-negative"):
        decode_metadata(bad)
    newer = pb.LedgerOffloadMetadata(format_version=2, topic="t", offload_uuid="u").SerializeToString()
    with pytest.raises(CorruptObjectError, match="unsupported format version 2"):
        decode_metadata(newer)
    with pytest.raises(CorruptObjectError, match="topic"):
        decode_metadata(b"")


def test_unknown_fields_are_damage():
    # field 99 varint 1: only this writer makes the objects, a field it does not know is damage
    with pytest.raises(CorruptObjectError, match=r"unknown field\(s\) \[99\]"):
        decode_metadata(encode_metadata(META) + b"\x98\x06\x01")
    # one bit flipped in the page index's tag (field 11 -> 15): not an index "without pages"
    with_pages = dataclasses.replace(META, entry_count=2, pages=PageIndex(65536, (0, 1), (0, 100), (7, 9)),
                                     data_object_len=200, length=150)
    raw = encode_metadata(with_pages)
    assert decode_metadata(raw).pages is not None
    tag = raw.index(bytes([11 << 3 | 2]))
    with pytest.raises(CorruptObjectError, match=r"unknown field\(s\) \[15\]"):
        decode_metadata(raw[:tag] + bytes([raw[tag] ^ 0x20]) + raw[tag + 1:])


def test_user_metadata():
    assert USER_METADATA == {"s3managedledgeroffloaderformatversion": "1"}
    md = user_metadata("a/b é")
    assert md == {FORMAT_VERSION_KEY: "1", TOPIC_KEY: "a%2Fb%20%C3%A9"}
    assert all(v.isascii() for v in md.values())
    assert check_user_metadata({k.upper(): v for k, v in md.items()}, "k") == "a/b é"
    with pytest.raises(CorruptObjectError, match="expected '1'"):
        check_user_metadata({FORMAT_VERSION_KEY: "2"}, "key t/x")
    with pytest.raises(CorruptObjectError):
        check_user_metadata({}, "key t/x")


def test_regeneration_command_is_documented():
    doc = importlib.import_module("tiering.format.metadata").__doc__
    assert "grpc_tools.protoc -I tiering/format --python_out=tiering/format" in doc


def test_generated_code_matches_the_proto(tmp_path):
    pytest.importorskip("grpc_tools")
    out = tmp_path / "set.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", f"-I{FORMAT_DIR}", f"--descriptor_set_out={out}",
                    str(FORMAT_DIR / "ledger_metadata.proto")], check=True)
    from google.protobuf import descriptor_pb2

    fresh = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]
    checked_in = descriptor_pb2.FileDescriptorProto()
    pb.DESCRIPTOR.CopyToProto(checked_in)
    for message in [*fresh.message_type, *fresh.message_type[0].nested_type]:
        for f in message.field:
            f.ClearField("json_name")  # protoc emits json names in descriptor sets, CopyToProto does not
    assert checked_in == fresh, "ledger_metadata_pb2.py is stale: regenerate it (see tiering/format/metadata.py)"
