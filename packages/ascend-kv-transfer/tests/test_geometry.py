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


MLA = KVGeometry(block_size=16, dtype="float32", num_kv_heads=1, head_size=576, layout="default", tp_size=2,
                 tp_replicated=True)


def test_replicated_latent_may_cross_tp_sizes_when_the_reader_takes_one_rank():
    import msgspec

    decode = msgspec.structs.replace(MLA, tp_size=1)
    check_geometry(decode, MLA, "peer", any_tp_if_replicated=True)
    # Still refused where ranks pair one to one (layerwise pushes) ...
    with pytest.raises(GeometryMismatchError, match="tp_size") as info:
        check_geometry(decode, MLA, "peer")
    assert info.value.field == "tp_size"
    # ... and everything else that makes the bytes meaningful is still compared.
    for field, value in (("block_size", 32), ("dtype", "bfloat16"), ("head_size", 512), ("layout", "LBHNC"),
                         ("pp_size", 2)):
        with pytest.raises(GeometryMismatchError, match=field) as info:
            check_geometry(decode, msgspec.structs.replace(MLA, **{field: value}), "peer", any_tp_if_replicated=True)
        assert info.value.field == field
    # A peer whose ranks do not hold the same KV: its TP size must be ours.
    split = msgspec.structs.replace(MLA, tp_replicated=False)
    with pytest.raises(GeometryMismatchError, match="tp_size"):
        check_geometry(decode, split, "peer", any_tp_if_replicated=True)
    with pytest.raises(GeometryMismatchError, match="tp_replicated"):
        check_geometry(MLA, split, "peer", any_tp_if_replicated=True)


def test_split_heads_refuse_a_tp_mismatch_by_name_even_where_replicas_are_allowed():
    import msgspec

    prefill = msgspec.structs.replace(BASE, tp_size=2, num_kv_heads=1)  # its heads are split over two ranks
    with pytest.raises(GeometryMismatchError, match="tp_size is 1 here but 2 on the peer") as info:
        check_geometry(BASE, prefill, "peer", any_tp_if_replicated=True)
    assert info.value.field == "tp_size"


def test_regions_pair_by_layer_name():
    mine = [LayerRegion("a", 0, 10, 10, 5), LayerRegion("b", 100, 10, 10, 5)]
    theirs = AgentMetadata("p", "h", 1, BASE, [LayerRegion("b", 7, 10, 10, 5), LayerRegion("a", 9, 10, 10, 5)])
    assert [(m.name, t.base_addr) for m, t in match_regions(mine, theirs)] == [("a", 9), ("b", 7)]
    with pytest.raises(GeometryMismatchError, match="'b'"):
        match_regions(mine, AgentMetadata("p", "h", 1, BASE, [LayerRegion("a", 9, 10, 10, 5)]))
    with pytest.raises(GeometryMismatchError, match="page_bytes"):
        match_regions(mine[:1], AgentMetadata("p", "h", 1, BASE, [LayerRegion("a", 9, 10, 20, 5)]))
