"""Where buffers land: the device asked for, and host memory for host-resident caches (private mode follows each
layer's spec; shared mode follows the planner's descriptors). The `meta` device stands in for the NPU here."""

from __future__ import annotations

import torch

from ascend_core.kv.allocator import allocate_kv_caches
from ascend_core.kv.specs import AscendMLAAttentionSpec


def _mla(host: bool):
    return AscendMLAAttentionSpec.create(block_size=32, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                                         rope_head_dim=64, host_resident=host)


def test_private_host_resident_layers_go_to_host_memory(plan):
    specs = {f"model.layers.{i}.attn": _mla(host=i >= 2) for i in range(4)}
    config = plan(specs, 1 << 20)
    assert len(config.kv_cache_tensors) == 2  # the host flag keeps the specs apart: one descriptor each
    alloc = allocate_kv_caches(config, device="meta", host_device="cpu", mode="private")
    for name, kv in alloc.layers.items():
        assert kv.latent.device.type == ("cpu" if specs[name].host_resident else "meta"), name
    host_storages = [s for s in alloc.storages if s.device.type == "cpu"]
    assert sorted(n for s in host_storages for n in s.layers) == ["model.layers.2.attn", "model.layers.3.attn"]


def test_shared_backing_is_allocated_on_the_requested_device(plan, kv_cases):
    specs, memory, _ = kv_cases["sliding_window_hybrid"]()
    config = plan(specs, memory)
    alloc = allocate_kv_caches(config, device="meta")
    assert {kv.key.device.type for kv in alloc.layers.values()} == {"meta"}
    assert {t.device.type for t in alloc.as_vllm_kv_caches().values()} == {"meta"}
    assert len(alloc.storages) == 1 and alloc.storages[0].nbytes == config.kv_cache_tensors[0].size
