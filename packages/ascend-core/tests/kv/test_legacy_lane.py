"""The legacy lane (<= 0.28): `shared_by` descriptors, each its own buffer aliased by one layer per group.

Descriptors are stand-ins shaped like vLLM 0.28's `KVCacheTensor`, built through the lane adapter; groups and
specs come from the installed vLLM's planner. The views must be the very views the current lane gives.
"""

from __future__ import annotations

import dataclasses

import pytest

from ascend_core.kv.allocator import KV_TRANSFER_ALIGNMENT, allocate_kv_caches
from ascend_core.kv.placement import layer_specs
from ascend_core.upstream import kv_tensor_layers, make_kv_tensor


@dataclasses.dataclass
class LegacyKVCacheTensor:  # vllm 0.28
    size: int
    shared_by: list[str]
    offset: int = 0
    block_stride: int = 0


@dataclasses.dataclass
class LegacyKVCacheConfig:  # vllm 0.28 (fields the allocator reads)
    num_blocks: int
    kv_cache_tensors: list
    kv_cache_groups: list


def legacy_config(current):
    """What the legacy planner made of the same groups: tensor i is shared by layer i of every group."""
    groups = current.kv_cache_groups
    specs = layer_specs(groups)
    tensors = []
    for i in range(max(len(g.layer_names) for g in groups)):  # a shorter group is padded: no layer there
        names = [g.layer_names[i] for g in groups if i < len(g.layer_names)]
        size = max(specs[n][1].page_size_bytes for n in names) * current.num_blocks
        tensors.append(make_kv_tensor(size, names, cls=LegacyKVCacheTensor))
    return LegacyKVCacheConfig(current.num_blocks, tensors, groups)


@pytest.mark.parametrize("case", ["dense_gqa", "sliding_window_hybrid", "mamba_hybrid", "eagle_draft", "mla_ratio1"])
def test_legacy_descriptors_give_the_current_lane_views(plan, kv_cases, kv_checks, case):
    specs, memory, eagle = kv_cases[case]()
    current = plan(specs, memory, "LBHNC", eagle_layer=eagle)
    legacy = legacy_config(current)
    assert all(kv_tensor_layers(t) == t.shared_by for t in legacy.kv_cache_tensors)
    new = allocate_kv_caches(current, device="cpu", layout="LBHNC")
    old = allocate_kv_caches(legacy, device="cpu", layout="LBHNC")
    for name, kv in new.layers.items():
        mine = old.layers[name]
        assert type(mine) is type(kv)
        for a, b in zip(_tensors(mine), _tensors(kv), strict=True):
            assert (a.shape, a.stride(), a.dtype) == (b.shape, b.stride(), b.dtype), name
    kv_checks.tags(legacy, old)
    # One real buffer per descriptor, its layers aliasing it from byte 0.
    assert [s.layers for s in old.storages] == [tuple(t.shared_by) for t in legacy.kv_cache_tensors]
    for storage in old.storages:
        assert {_tensors(old.layers[n])[0].data_ptr() for n in storage.layers} == {storage.data_ptr}


def test_legacy_storages_align_for_kv_transfer(plan, kv_cases):
    specs, memory, _ = kv_cases["sliding_window_hybrid"]()
    legacy = legacy_config(plan(specs, memory, "LBHNC"))
    alloc = allocate_kv_caches(legacy, device="cpu", kv_transfer=True)
    assert len(alloc.storages) == len(legacy.kv_cache_tensors)
    assert all(s.data_ptr % KV_TRANSFER_ALIGNMENT == 0 for s in alloc.storages)


def _tensors(kv):
    return list(kv.tensors) if hasattr(kv, "tensors") else [v for v in vars(kv).values() if v is not None]
