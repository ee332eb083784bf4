"""Configs the allocator must refuse, each with an error naming the descriptor or layer and the values."""

from __future__ import annotations

import dataclasses

import pytest

from ascend_core.kv.allocator import allocate_kv_caches
from ascend_core.kv.errors import KVLayoutError


@pytest.fixture(scope="module")
def hybrid(plan, kv_cases):
    specs, memory, _ = kv_cases["sliding_window_hybrid"]()
    return plan(specs, memory, "LBHNC")


@pytest.fixture(scope="module")
def dense(plan, kv_cases):
    specs, memory, _ = kv_cases["dense_gqa"]()
    return plan(specs, memory, "LBHNC")


def test_unequal_descriptor_sizes(hybrid, edit_tensor):
    size = hybrid.kv_cache_tensors[0].size
    bad = edit_tensor(hybrid, 1, size=size + 4096)
    with pytest.raises(KVLayoutError, match=rf"unequal sizes \(size {size}: tensors \[0, 2\]; "
                                            rf"size {size + 4096}: tensors \[1\]\)"):
        allocate_kv_caches(bad, device="cpu")


def test_uncovered_layer(hybrid, edit_tensor):
    layers = list(hybrid.kv_cache_tensors[1].layers)
    bad = edit_tensor(hybrid, 1, layers=layers[:-1])
    with pytest.raises(KVLayoutError, match=rf"layer '{layers[-1]}' \(cache group \d\) is covered by no KV cache"):
        allocate_kv_caches(bad, device="cpu")


def test_layer_in_two_descriptors_of_one_group(dense):
    first = dense.kv_cache_tensors[0]
    extra = dataclasses.replace(first, layers=[first.layers[0]])
    bad = dataclasses.replace(dense, kv_cache_tensors=[first, extra])
    with pytest.raises(KVLayoutError, match=rf"layer '{first.layers[0]}' \(cache group 0\) is in two KV cache "
                                            rf"tensors of one group: #0 and #1"):
        allocate_kv_caches(bad, device="cpu")


def test_descriptor_naming_an_unknown_layer(dense, edit_tensor):
    bad = edit_tensor(dense, 0, layers=[*dense.kv_cache_tensors[0].layers, "model.layers.99.attn"])
    with pytest.raises(KVLayoutError, match=r"tensor #0 names layer 'model.layers.99.attn', which no cache group"):
        allocate_kv_caches(bad, device="cpu")


def test_block_stride_smaller_than_a_page(dense, edit_tensor):
    page = dense.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    bad = edit_tensor(dense, 0, block_stride=page - 64)
    with pytest.raises(KVLayoutError, match=rf"tensor #0, layer '.*': block_stride={page - 64} is smaller than a "
                                            rf"page \({page} bytes\)"):
        allocate_kv_caches(bad, device="cpu")


def test_layer_stride_folding_layers_onto_each_other(dense, edit_tensor):
    page = dense.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    bad = edit_tensor(dense, 0, layer_stride=page * 3)
    with pytest.raises(KVLayoutError, match=rf"layer_stride={page * 3} is smaller than the \d+ bytes its "
                                            rf"{dense.num_blocks} block pages span"):
        allocate_kv_caches(bad, device="cpu")


def test_view_past_the_end_of_its_backing(dense, edit_tensor):
    tensor = dense.kv_cache_tensors[0]
    bad = edit_tensor(dense, 0, offset=4096)
    last = tensor.layers[-1]
    with pytest.raises(KVLayoutError, match=rf"tensor #0, layer '{last}': its view ends at byte {tensor.size + 4096}"
                                            rf", past the end of its backing \({tensor.size} bytes; offset=4096"):
        allocate_kv_caches(bad, device="cpu")


def test_layer_in_two_groups(dense):
    group = dense.kv_cache_groups[0]
    twice = dataclasses.replace(dense, kv_cache_groups=[group, dataclasses.replace(group, layer_names=[
        group.layer_names[0]])])
    with pytest.raises(KVLayoutError, match=rf"layer '{group.layer_names[0]}' is in cache groups 0 and 1"):
        allocate_kv_caches(twice, device="cpu")


def test_unknown_mode_and_layout(dense):
    with pytest.raises(ValueError, match="mode must be 'shared' or 'private', got 'pooled'"):
        allocate_kv_caches(dense, device="cpu", mode="pooled")
    with pytest.raises(ValueError, match="unknown KV cache layout 'XYZ'"):
        allocate_kv_caches(dense, device="cpu", layout="XYZ")


def test_kernel_split_needs_dense_pages(plan, kv_cases):
    specs, memory, _ = kv_cases["dense_gqa"]()
    config = plan(specs, memory, "BLHNC")  # block-outer: other layers' pages sit between blocks
    with pytest.raises(KVLayoutError, match=r"block_stride=\d+ is not one dense page \(\d+ bytes\), so a block "
                                            r"cannot be split into 2 kernel blocks of 16 tokens"):
        allocate_kv_caches(config, device="cpu", kernel_block_sizes=[16])
