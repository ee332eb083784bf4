"""Where a pool object's bytes live: one block's pages of a group's layers, coalesced when back to back."""

import pytest
import torch

from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.pool.block_layout import BlockLayout, Segment, coalesce


def test_layer_major_layout_is_one_buffer_per_layer():
    caches = {f"l{i}": torch.zeros(8, 2, 4, 16) for i in range(3)}
    regions = describe_kv_caches(caches, 8).regions
    layout = BlockLayout(regions, {0: ["l0", "l1", "l2"]})
    page = 2 * 4 * 16 * 4
    assert layout.object_bytes(0) == 3 * page
    addrs, sizes = layout.buffers(0, 5)
    assert addrs == [caches[f"l{i}"][5].data_ptr() for i in range(3)] and sizes == [page] * 3
    with pytest.raises(ValueError, match="block 8 outside KV cache group 0"):
        layout.buffers(0, 8)


def test_block_major_layout_coalesces_layers():
    backing = torch.zeros(8, 3, 2, 4, 16)  # [blocks, layers, ...]: a block's layer pages are back to back
    caches = {f"l{i}": backing[:, i] for i in range(3)}
    layout = BlockLayout(describe_kv_caches(caches, 8).regions, {0: ["l0", "l1", "l2"]})
    addrs, sizes = layout.buffers(0, 2)
    assert addrs == [backing[2].data_ptr()] and sizes == [backing[2].nbytes]


def test_coalesce_needs_equal_stride_and_adjacency():
    from ascend_kv_transfer.p2p.schema import LayerRegion

    a = LayerRegion("a", base_addr=0, block_stride=64, page_bytes=32, num_blocks=4)
    b = LayerRegion("b", base_addr=32, block_stride=64, page_bytes=32, num_blocks=4)
    c = LayerRegion("c", base_addr=1000, block_stride=64, page_bytes=32, num_blocks=4)
    assert coalesce([a, b, c]) == [Segment(0, 64, 64), Segment(1000, 64, 32)]
    assert coalesce([b, a]) == [Segment(32, 64, 32), Segment(0, 64, 32)]  # order is the object's byte order


def test_group_without_memory_is_refused():
    caches = {"l0": torch.zeros(4, 2, 16)}
    with pytest.raises(ValueError, match="KV cache group 1 has no KV memory"):
        BlockLayout(describe_kv_caches(caches, 4).regions, {0: ["l0"], 1: ["l9"]})
