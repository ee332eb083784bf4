"""The side-channel schema: typed round trips, version refusal, garbage refusal."""

import msgspec
import pytest

from ascend_kv_transfer.p2p import schema


def _meta():
    geo = schema.KVGeometry(block_size=128, dtype="float32", num_kv_heads=2, head_size=32, layout="LBHNC")
    regions = [schema.LayerRegion(name="model.layers.0.self_attn.attn", base_addr=1 << 40, block_stride=65536,
                                  page_bytes=65536, num_blocks=10)]
    return schema.AgentMetadata(engine_id="p", host="127.0.0.1", rpc_port=1234, geometry=geo, regions=regions)


@pytest.mark.parametrize("message", [
    schema.MetadataRequest(requester="d"),
    schema.MetadataResponse(metadata=_meta()),
    schema.ClaimRequest(transfer_id="t", requester="d"),
    schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=[[1, 2, 3]]),
    schema.DoneNotice(transfer_id="t", ok=False),
    schema.Ack(),
    schema.ErrorResponse(error="nope"),
])
def test_round_trip(message):
    assert schema.decode(schema.encode(message)) == message


def test_other_version_is_refused_with_both_versions():
    data = schema.encode(schema.ClaimRequest(version=schema.SCHEMA_VERSION + 1, transfer_id="t"))
    pattern = f"version {schema.SCHEMA_VERSION + 1}.*version {schema.SCHEMA_VERSION}"
    with pytest.raises(schema.SchemaError, match=pattern):
        schema.decode(data)


def test_garbage_and_unknown_tags_are_refused():
    with pytest.raises(schema.SchemaError):
        schema.decode(b"\xff\x00garbage")
    with pytest.raises(schema.SchemaError):
        schema.decode(msgspec.msgpack.encode({"type": "teleport", "version": 1}))
