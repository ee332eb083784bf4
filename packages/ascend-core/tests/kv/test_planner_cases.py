"""The allocator on configs from vLLM's own planner, for the model shapes the plugin serves.

For each case and layout: every (layer, block) page written through our views reads back at the descriptor's
byte offset, pages of a group never overlap, groups overlay one backing from byte 0, and the views vLLM's forward
context and KV connectors get are exactly vLLM's own `allocate_kv_cache` views.
"""

from __future__ import annotations

import pytest
import torch
from vllm.v1.kv_cache_interface import MambaSpec

from ascend_core.kv.allocator import KV_TRANSFER_ALIGNMENT, allocate_kv_caches
from ascend_core.kv.views import MLAKV, AttentionKV, IndexerKV, MambaState

# Mixed page sizes need a block-compact layout (vLLM's validate_kv_cache_layout rejects the others): MLA with its
# indexer always mixes them; a Mamba hybrid does under block-outermost layouts (vLLM packs instead of padding).
_PLANNER_REJECTS = {("mla_ratio4", "LHBNC"), ("mla_ratio4", "BHLNC"), ("mamba_hybrid", "BHLNC")}
CASES = ("dense_gqa", "sliding_window_hybrid", "mla_ratio1", "mla_ratio4", "mamba_hybrid", "eagle_draft")
LAYOUT_CASES = [(c, lay) for c in CASES for lay in ("LBHNC", "LBNHC", "BLHNC", "BLNHC", "LHBNC", "BHLNC")
                if (c, lay) not in _PLANNER_REJECTS]


@pytest.mark.parametrize(("case", "layout"), LAYOUT_CASES)
def test_shared_views_match_descriptors_and_vllm(plan, kv_checks, kv_cases, case, layout):
    specs, memory, eagle = kv_cases[case]()
    config = plan(specs, memory, layout, eagle_layer=eagle)
    alloc = allocate_kv_caches(config, device="cpu")
    assert set(alloc.layers) == set(specs)
    kv_checks.parity(config, alloc, layout)
    kv_checks.overlay(config, alloc)
    if layout in kv_checks.block_compact:
        kv_checks.tags(config, alloc)


@pytest.mark.parametrize("case", CASES)
def test_private_buffers_hold_every_page_once(plan, kv_checks, kv_cases, case):
    specs, memory, eagle = kv_cases[case]()
    config = plan(specs, memory, "LBHNC", eagle_layer=eagle)
    alloc = allocate_kv_caches(config, device="cpu", mode="private")
    assert len(alloc.storages) == len(specs)
    assert [s.layers for s in alloc.storages] == [(n,) for g in config.kv_cache_groups for n in g.layer_names]
    kv_checks.tags(config, alloc, mode="private")


@pytest.mark.parametrize("case", CASES)
def test_typed_views_have_the_logical_shapes(plan, kv_cases, case):
    specs, memory, eagle = kv_cases[case]()
    config = plan(specs, memory, "BLHNC", eagle_layer=eagle)
    alloc = allocate_kv_caches(config, device="cpu")
    blocks = config.num_blocks
    for name, kv in alloc.layers.items():
        spec = specs[name]
        if isinstance(kv, AttentionKV):
            want = (blocks, spec.block_size, spec.num_kv_heads, spec.head_size)
            assert kv.key.shape == want and kv.value.shape == want and kv.key.dtype == spec.dtype
        elif isinstance(kv, MLAKV):
            latent = spec.head_size - spec.rope_head_dim
            assert kv.latent.shape == (blocks, spec.storage_block_size, 1, latent)
            assert kv.rope.shape == (blocks, spec.storage_block_size, 1, spec.rope_head_dim)
            assert (kv.scale is None) == (spec.scale_dim == 0)
            if kv.scale is not None:
                assert kv.scale.shape == (blocks, spec.storage_block_size, 1, spec.scale_dim)
                assert kv.scale.dtype == spec.scale_dtype
        elif isinstance(kv, IndexerKV):
            assert kv.k.shape == (blocks, spec.storage_block_size, 1, spec.head_size)
            assert kv.scale.shape == (blocks, spec.storage_block_size, 1, 1)
        else:
            assert isinstance(kv, MambaState)
            assert [tuple(t.shape) for t in kv.tensors] == [(blocks, *s) for s in spec.shapes]


def test_eagle_draft_group_overlays_the_target_groups(plan, kv_cases):
    specs, memory, draft = kv_cases["eagle_draft"]()
    config = plan(specs, memory, "LBHNC", eagle_layer=draft)
    eagle_groups = [g for g in config.kv_cache_groups if g.is_eagle_group]
    assert len(eagle_groups) == 1 and len(config.kv_cache_groups) == 2
    alloc = allocate_kv_caches(config, device="cpu")
    draft_key = alloc.layers[draft].key
    target = next(n for n in config.kv_cache_groups[1 - config.kv_cache_groups.index(eagle_groups[0])].layer_names)
    # Same backing, same first byte: a block id belongs to one group at a time, so the overlay is sound.
    assert draft_key.untyped_storage().data_ptr() == alloc.layers[target].key.untyped_storage().data_ptr()


def test_mamba_pages_are_padded_to_the_attention_page(plan, kv_cases):
    specs, memory, _ = kv_cases["mamba_hybrid"]()
    config = plan(specs, memory, "LBHNC")
    mamba = next(g for g in config.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)).kv_cache_spec
    assert mamba.page_size_padded == 32 * 2 * 64 * 4 > 3 * 64 * 4 + 4 * 16 * 16 * 4
    alloc = allocate_kv_caches(config, device="cpu")
    name = next(n for n in specs if "mixer" in n)
    conv, ssm = alloc.layers[name].tensors
    assert conv.stride(0) * 4 == mamba.page_size_padded  # one padded page per block


@pytest.mark.parametrize("mode", ["shared", "private"])
def test_kv_transfer_storages_are_2mib_aligned_and_cover_each_layer_once(plan, kv_cases, mode):
    specs, memory, _ = kv_cases["mamba_hybrid"]()
    config = plan(specs, memory, "LBHNC")
    alloc = allocate_kv_caches(config, device="cpu", mode=mode, kv_transfer=True)
    assert all(s.data_ptr % KV_TRANSFER_ALIGNMENT == 0 for s in alloc.storages)
    listed = [n for s in alloc.storages for n in s.layers]
    assert sorted(listed) == sorted(specs)
    assert len({s.data_ptr for s in alloc.storages}) == len(alloc.storages)
    for s in alloc.storages:
        for name in s.layers:
            views = alloc.layers[name]
            parts = views.tensors if isinstance(views, MambaState) else [v for v in vars(views).values() if
                                                                         isinstance(v, torch.Tensor)]
            for t in parts:
                assert s.data_ptr <= t.data_ptr() < s.data_ptr + s.nbytes, name


def test_kernel_block_split_matches_vllm(plan, kv_cases):
    from vllm.v1.kv_cache_layout import KVCacheLayout
    from vllm.v1.worker.utils import allocate_kv_cache

    specs, memory, _ = kv_cases["dense_gqa"]()
    config = plan(specs, memory, "LBHNC")
    ref = allocate_kv_cache(config, torch.device("cpu"), KVCacheLayout.LBHNC, kernel_block_sizes=[16])
    alloc = allocate_kv_caches(config, device="cpu", kernel_block_sizes=[16])
    for name, want in ref.items():
        got = alloc.as_vllm_kv_caches()[name]
        assert (got.shape, got.stride()) == (want.shape, want.stride())
        assert alloc.layers[name].key.shape == (config.num_blocks * 2, 16, 2, 64)
