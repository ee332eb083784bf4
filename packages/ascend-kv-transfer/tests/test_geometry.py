"""Handshake checks name the field that differs."""

import pytest

from ascend_kv_transfer.p2p.geometry import GeometryMismatchError, check_geometry, match_regions
from ascend_kv_transfer.p2p.schema import AgentMetadata, KVGeometry, LayerRegion

BASE = KVGeometry(block_size=128, dtype="float32", num_kv_heads=2, head_size=32, layout="LBHNC")


@pytest.mark.parametrize(("field", "value"), [("block_size", 64), ("dtype", "bfloat16"), ("num_kv_heads", 4),
                                              ("head_size", 64), ("tp_size", 2)])
def test_mismatch_names_the_field(field, value):
    import msgspec

    other = msgspec.structs.replace(BASE, **{field: value})
    with pytest.raises(GeometryMismatchError, match=field) as info:
        check_geometry(BASE, other, "peer")
    assert info.value.field == field


def test_equal_geometry_passes():
    check_geometry(BASE, BASE, "peer")


def test_regions_pair_by_layer_name():
    mine = [LayerRegion("a", 0, 10, 10, 5), LayerRegion("b", 100, 10, 10, 5)]
    theirs = AgentMetadata("p", "h", 1, BASE, [LayerRegion("b", 7, 10, 10, 5), LayerRegion("a", 9, 10, 10, 5)])
    assert [(m.name, t.base_addr) for m, t in match_regions(mine, theirs)] == [("a", 9), ("b", 7)]
    with pytest.raises(GeometryMismatchError, match="'b'"):
        match_regions(mine, AgentMetadata("p", "h", 1, BASE, [LayerRegion("a", 9, 10, 10, 5)]))
    with pytest.raises(GeometryMismatchError, match="page_bytes"):
        match_regions(mine[:1], AgentMetadata("p", "h", 1, BASE, [LayerRegion("a", 9, 10, 20, 5)]))
