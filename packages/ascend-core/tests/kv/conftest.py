"""Fixtures for the KV tests: a minimal real VllmConfig (no engine), vLLM's own planner, the model cases, and the
invariant checks every allocation must pass (byte tags read back at the descriptor's offsets, parity with vLLM)."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

from ascend_core.kv.specs import AscendMLAAttentionSpec, AscendSparseIndexerSpec
from ascend_core.upstream import kv_tensor_geometry, kv_tensor_layers
from ascend_core.upstream.kv_page import kv_tensor_shares_config_backing

BLOCK_COMPACT_LAYOUTS = ("LBHNC", "LBNHC", "BLHNC", "BLNHC")
ALL_LAYOUTS = (*BLOCK_COMPACT_LAYOUTS, "LHBNC", "BHLNC")
TAG_MODULI = (251, 241)  # two passes: two pages share both tags only 60491 pages apart


@pytest.fixture(scope="session")
def vllm_config(tmp_path_factory):
    """A real VllmConfig around a config.json only (no weights, no engine): what the planner reads."""
    from transformers import LlamaConfig
    from vllm.config import CacheConfig, ModelConfig, VllmConfig

    from ascend_core.kv.specs import register_ascend_kv_specs

    model_dir = tmp_path_factory.mktemp("kv-model")
    LlamaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                intermediate_size=128, max_position_embeddings=2048).save_pretrained(model_dir)
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        model_config = ModelConfig(model=str(model_dir), max_model_len=128, skip_tokenizer_init=True, dtype="float32")
        config = VllmConfig(model_config=model_config, cache_config=CacheConfig(block_size=32))
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old
    register_ascend_kv_specs()
    return config


@pytest.fixture(scope="session")
def plan(vllm_config):
    """`plan(specs, memory, layout)` -> the KVCacheConfig vLLM's own `get_kv_cache_configs` produces."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs

    def _plan(specs, memory, layout="LBHNC", eagle_layer=None):
        cache = vllm_config.cache_config
        old = cache.kv_cache_layout
        cache.kv_cache_layout = layout
        try:
            config = get_kv_cache_configs(vllm_config, [dict(specs)], [memory])[0]
        finally:
            cache.kv_cache_layout = old
        config.kv_cache_layout = layout
        if eagle_layer is not None:
            # vLLM flags the draft's group from the speculative config (the group holding the last registered
            # layer); a SpeculativeConfig needs a draft model, so flag it the same way here.
            for group in config.kv_cache_groups:
                group.is_eagle_group = eagle_layer in group.layer_names
        return config

    return _plan


def _u8_parts(layer_kv) -> list[torch.Tensor]:
    parts = [t for t in (layer_kv.tensors if hasattr(layer_kv, "tensors") else vars(layer_kv).values())
             if isinstance(t, torch.Tensor)]
    return [p.view(torch.uint8) if p.dim() and p.stride(-1) == 1 else p for p in parts]


def _fill_blocks(layer_kv, tags: torch.Tensor) -> None:
    """Write tag[b] into every byte of block b through every typed view of the layer."""
    for part in _u8_parts(layer_kv):
        if part.dtype != torch.uint8:
            part = part.contiguous().view(torch.uint8)  # pragma: no cover - every part has a dense last dim
        shape = (part.shape[0],) + (1,) * (part.dim() - 1)
        part.copy_(tags.view(shape).expand_as(part))


def _page_sites(config, alloc, mode):
    """Per group: [(layer, base tensor, byte offset of block 0, block stride, real page bytes)] from the
    descriptors (shared) or the layer's own storage (private)."""
    from ascend_core.kv.placement import layer_specs
    from ascend_core.upstream.kv_page import kv_spec_page_shape

    specs = layer_specs(config.kv_cache_groups)
    storage_of = {name: s for s in alloc.storages for name in s.layers}
    sites: dict[int, list] = {}
    if mode == "private":
        for name, (gid, spec) in specs.items():
            h, n, c = kv_spec_page_shape(spec)
            page = max(h * n * c, getattr(spec, "page_size_padded", None) or 0)
            sites.setdefault(gid, []).append((name, storage_of[name].tensor, 0, page, h * n * c))
        return sites
    for tensor in config.kv_cache_tensors:
        offset, layer_stride, block_stride = kv_tensor_geometry(tensor)
        shares = kv_tensor_shares_config_backing(tensor)
        for index, name in enumerate(kv_tensor_layers(tensor)):
            gid, spec = specs[name]
            h, n, c = kv_spec_page_shape(spec)
            stride = block_stride or max(h * n * c, getattr(spec, "page_size_padded", None) or 0)
            start = offset + (index * layer_stride if shares else 0)
            sites.setdefault(gid, []).append((name, storage_of[name].tensor, start, stride, h * n * c))
    return sites


def check_tags(config, alloc, mode="shared"):
    """Every (layer, block) page of a group, written with a distinct tag through the views, reads back at the
    byte offset the descriptor says; a page overlapping another of its group would lose its tag."""
    num_blocks = config.num_blocks
    for gid, sites in _page_sites(config, alloc, mode).items():
        for modulus in TAG_MODULI:
            tags = {}
            for i, (name, *_rest) in enumerate(sites):
                idx = torch.arange(num_blocks) + i * num_blocks
                tags[name] = (idx % modulus + 1).to(torch.uint8)
                _fill_blocks(alloc.layers[name], tags[name])
            for name, base, start, stride, page in sites:
                got = torch.as_strided(base, (num_blocks, page), (stride, 1), base.storage_offset() + start)
                want = tags[name].view(-1, 1).to(torch.int8)
                bad = (got != want).any(dim=1).nonzero().flatten()
                assert bad.numel() == 0, (f"group {gid} layer {name}: block {int(bad[0])} does not hold its tag at "
                                          f"byte {start + int(bad[0]) * stride} (modulus {modulus})")


def check_vllm_parity(config, alloc, layout):
    """Our `as_vllm_kv_caches()` equals what vLLM's own allocate_kv_cache returns for the same config."""
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    ref = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout[layout])
    ours = alloc.as_vllm_kv_caches()
    assert ref.keys() == ours.keys()
    ref_base = {id(t.untyped_storage()): t for t in ref.values()}
    assert len(ref_base) == 1 and len({t.untyped_storage().data_ptr() for t in ours.values()}) == 1
    ours_base = alloc.storages[0].tensor
    for name, want in ref.items():
        got = ours[name]
        assert (got.shape, got.stride(), got.dtype) == (want.shape, want.stride(), want.dtype), name
        got_off = got.storage_offset() * got.element_size() - ours_base.storage_offset()
        assert got_off == want.storage_offset() * want.element_size(), name


def check_overlay(config, alloc):
    """Groups start at byte 0 of one backing and stay inside it, as upstream's planner intends."""
    assert len(alloc.storages) == 1
    starts: dict[int, int] = {}
    group_of = {n: g for g, grp in enumerate(config.kv_cache_groups) for n in grp.layer_names}
    for tensor in config.kv_cache_tensors:
        gid = group_of[kv_tensor_layers(tensor)[0]]
        starts[gid] = min(starts.get(gid, tensor.size), kv_tensor_geometry(tensor)[0])
    assert all(v == 0 for v in starts.values()), starts
    assert alloc.storages[0].nbytes == config.kv_cache_tensors[0].size


@pytest.fixture(scope="session")
def kv_checks():
    return SimpleNamespace(tags=check_tags, parity=check_vllm_parity, overlay=check_overlay,
                           block_compact=BLOCK_COMPACT_LAYOUTS, all_layouts=ALL_LAYOUTS)


def replace_tensor(config, index, **changes):
    """A copy of `config` with descriptor `index` changed (for the error tests)."""
    tensors = list(config.kv_cache_tensors)
    tensors[index] = dataclasses.replace(tensors[index], **changes)
    return dataclasses.replace(config, kv_cache_tensors=tensors)


@pytest.fixture(scope="session")
def edit_tensor():
    return replace_tensor


# The model shapes the plugin serves: each builder returns (layer specs, planner memory, EAGLE draft layer).
MiB = 1 << 20


def _attn(i: int) -> str:
    return f"model.layers.{i}.self_attn.attn"


def dense_gqa():
    return {_attn(i): FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
            for i in range(4)}, 1 * MiB, None


def sliding_window_hybrid():
    specs = {}
    for i in range(6):
        kw = dict(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
        specs[_attn(i)] = (FullAttentionSpec(**kw) if i % 3 == 2 else SlidingWindowSpec(sliding_window=64, **kw))
    return specs, 1 * MiB, None


def mla_ratio1():
    return {_attn(i): AscendMLAAttentionSpec.create(block_size=32, num_kv_heads=1, head_size=576,
                                                    dtype=torch.bfloat16, rope_head_dim=64)
            for i in range(3)}, 1 * MiB, None


def mla_ratio4():
    """DeepSeek-V4-like: C8 latent compressed 4:1 with scales, plus the sparse indexer cache (mixed page sizes)."""
    specs = {}
    for i in range(4):
        specs[_attn(i)] = AscendMLAAttentionSpec.create(
            ratio=4, block_size=64, num_kv_heads=1, head_size=576, dtype=torch.int8, rope_head_dim=64,
            scale_dim=4, scale_dtype=torch.float32, sparse_c8=True)
        specs[f"model.layers.{i}.self_attn.indexer.k_cache"] = AscendSparseIndexerSpec.create(
            ratio=4, block_size=64, num_kv_heads=1, head_size=128, dtype=torch.bfloat16, scale_dim=1,
            scale_dtype=torch.float32)
    return specs, 1 * MiB, None


def mamba_hybrid():
    specs = {}
    for i in range(6):
        if i % 3 == 2:
            specs[_attn(i)] = FullAttentionSpec(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
        else:
            specs[f"model.layers.{i}.mixer"] = MambaSpec(block_size=128, shapes=((3, 64), (4, 16, 16)),
                                                         dtypes=(torch.float32, torch.float32))
    return specs, 1 * MiB, None


def eagle_draft():
    """gpt-oss-like target (sliding + full) with one EAGLE draft layer registered last."""
    specs = {}
    kw = dict(block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32)
    for i in range(8):
        specs[_attn(i)] = SlidingWindowSpec(sliding_window=64, **kw) if i % 2 else FullAttentionSpec(**kw)
    draft = _attn(8)
    specs[draft] = FullAttentionSpec(**kw)
    return specs, 1 * MiB, draft


CASES = {f.__name__: f for f in (dense_gqa, sliding_window_hybrid, mla_ratio1, mla_ratio4, mamba_hybrid, eagle_draft)}


@pytest.fixture(scope="session")
def kv_cases():
    return CASES
