"""Byte geometry of vLLM's per-layer views: storage dedupe, contiguity and overlap checks, kernel-block ratio."""

import pytest
import torch

from ascend_kv_transfer.kv_regions import KVLayoutError, describe_kv_caches


def _layer_major(num_layers=3, blocks=8, heads=2, tokens=4, width=8, dtype=torch.float32):
    """Like vLLM's LBHNC allocation: one int8 buffer, per-layer [B, H, N, C] views."""
    page = heads * tokens * width * dtype.itemsize
    raw = torch.zeros(num_layers * blocks * page, dtype=torch.int8)
    views = {}
    for layer in range(num_layers):
        chunk = raw[layer * blocks * page:(layer + 1) * blocks * page]
        views[f"layers.{layer}"] = chunk.view(dtype).view(blocks, heads, tokens, width)
    return raw, views, page


def test_one_storage_behind_many_layers():
    raw, views, page = _layer_major()
    kv = describe_kv_caches(views, num_blocks=8, groups={"layers.2": 1})
    assert len(kv.storages) == 1 and kv.storages[0].addr == raw.data_ptr()
    assert kv.storages[0].nbytes == raw.nbytes
    assert [r.page_bytes for r in kv.regions] == [page] * 3
    assert [r.block_stride for r in kv.regions] == [page] * 3
    assert kv.regions[1].base_addr == raw.data_ptr() + 8 * page
    assert [r.group for r in kv.regions] == [0, 0, 1]
    assert kv.bytes_per_block == 3 * page


def test_separate_buffers_are_separate_storages():
    views = {f"l{i}": torch.zeros(4, 2, 4, 8) for i in range(2)}
    assert len(describe_kv_caches(views).storages) == 2


def test_block_major_layout_is_strided_but_valid():
    raw = torch.zeros(8, 2, 64)  # blocks x layers x page
    views = {"a": raw[:, 0, :].view(8, 64), "b": raw[:, 1, :].view(8, 64)}
    kv = describe_kv_caches(views)
    assert kv.regions[0].block_stride == 2 * 64 * 4 and kv.regions[0].page_bytes == 64 * 4
    assert len(kv.storages) == 1


def test_kernel_blocks_merge_into_manager_blocks():
    _, views, page = _layer_major(blocks=8)
    kv = describe_kv_caches(views, num_blocks=4)
    assert kv.regions[0].page_bytes == 2 * page and kv.regions[0].num_blocks == 4


def test_non_contiguous_page_is_rejected_with_the_layer_name():
    t = torch.zeros(2, 8, 4, 8).transpose(0, 1)  # heads outside blocks: a page is strided
    with pytest.raises(KVLayoutError, match="'bad'.*not one dense range"):
        describe_kv_caches({"bad": t})


def test_a_dense_page_in_another_order_is_one_page():
    # LBNHC as vLLM views it [B, H, N, C]: a block's tokens lie outside its heads, yet its page is one byte range.
    t = torch.zeros(8, 4, 2, 16).permute(0, 2, 1, 3)
    kv = describe_kv_caches({"nhd": t})
    assert kv.regions[0].page_bytes == 2 * 4 * 16 * 4 == kv.regions[0].block_stride


def test_overlapping_layers_are_rejected():
    raw = torch.zeros(10 * 64)
    views = {"a": raw[:8 * 64].view(8, 64), "b": raw[64:9 * 64].view(8, 64)}
    with pytest.raises(KVLayoutError, match="'a' and 'b' overlap"):
        describe_kv_caches(views)


def test_overlapping_pages_within_a_layer_are_rejected():
    raw = torch.zeros(1000)
    t = torch.as_strided(raw, (8, 64), (32, 1))
    with pytest.raises(KVLayoutError, match="pages overlap"):
        describe_kv_caches({"x": t})


def test_registered_memory_is_what_the_views_cover_not_the_allocation_padding():
    # Like the Ascend allocator with a KV transfer: the buffer starts on a 2 MiB boundary inside a padded allocation.
    align, page, blocks = 2 << 20, 4096, 16
    raw = torch.zeros(2 * blocks * page + align, dtype=torch.int8)
    pad = -raw.data_ptr() % align
    backing = raw[pad:pad + 2 * blocks * page]
    views = {f"l{i}": backing[i * blocks * page:(i + 1) * blocks * page].view(blocks, page) for i in range(2)}
    kv = describe_kv_caches(views)
    assert [(s.addr, s.nbytes) for s in kv.storages] == [(backing.data_ptr(), backing.numel())]
    assert kv.storages[0].addr % align == 0


def test_buffers_with_gaps_in_one_allocation_register_apart():
    # Private per-layer buffers cut from one slab, each on its own boundary: the gaps are not KV.
    slab = torch.zeros(3 * 4096, dtype=torch.int8)
    views = {"a": slab[:1024].view(4, 256), "b": slab[4096:4096 + 1024].view(4, 256)}
    kv = describe_kv_caches(views)
    assert [(s.addr - slab.data_ptr(), s.nbytes) for s in kv.storages] == [(0, 1024), (4096, 1024)]


def test_interleaved_layers_register_as_one_span():
    raw = torch.zeros(8, 2, 64)  # blocks x layers x page: the layers' extents overlap
    kv = describe_kv_caches({"a": raw[:, 0, :], "b": raw[:, 1, :]})
    assert [(s.addr, s.nbytes) for s in kv.storages] == [(raw.data_ptr(), raw.nbytes)]


def _hybrid_shared_tensor(blocks=6, pages=(64, 40)):
    """Like vLLM's hybrid allocator (DeepSeek V4): one tensor backs a layer of each group, each layer's page padded to
    the tensor's largest page, so block b of both layers is the same memory (the pool gives b to one group)."""
    stride = max(pages)
    raw = torch.zeros(blocks * stride, dtype=torch.int8)
    views = {f"g{g}": torch.as_strided(raw, (blocks, page), (stride, 1)) for g, page in enumerate(pages)}
    return raw, views


def test_layers_of_different_groups_may_share_a_tensor():
    raw, views = _hybrid_shared_tensor()
    kv = describe_kv_caches(views, groups={"g0": 0, "g1": 1})
    assert [(r.name, r.group, r.page_bytes, r.block_stride) for r in kv.regions] == [("g0", 0, 64, 64),
                                                                                    ("g1", 1, 40, 64)]
    # Registered once: the shared memory is one span, not two overlapping ones.
    assert [(s.addr, s.nbytes) for s in kv.storages] == [(raw.data_ptr(), raw.numel())]


def test_layers_of_one_group_sharing_a_tensor_are_still_rejected():
    _, views = _hybrid_shared_tensor()
    with pytest.raises(KVLayoutError, match="'g[01]' and 'g[01]' overlap"):
        describe_kv_caches(views, groups={"g0": 2, "g1": 2})


def test_a_dense_layer_and_a_padded_layer_of_one_stride_may_interleave_but_not_collide():
    raw = torch.zeros(8 * 96, dtype=torch.int8)
    dense = raw[:4 * 96].view(4, 96)  # stride = page
    padded = torch.as_strided(raw[4 * 96:], (4, 32), (96, 1))  # after it: fine
    describe_kv_caches({"dense": dense, "padded": padded})
    inside = torch.as_strided(raw[3 * 96 + 50:], (4, 32), (96, 1))  # starts inside dense's last page
    with pytest.raises(KVLayoutError, match="overlap"):
        describe_kv_caches({"dense": dense, "inside": inside})
