"""The Ascend KV specs: page arithmetic, merge errors naming the field, the ratio adapter, registry registration."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, SlidingWindowManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowMLASpec
from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

from ascend_core.kv.errors import KVSpecMergeError
from ascend_core.kv.specs import (
    AscendMLAAttentionSpec,
    AscendSlidingWindowMLASpec,
    AscendSparseIndexerSpec,
    register_ascend_kv_specs,
)
from ascend_core.upstream import mla_ratio


def c8(ratio=4, **overrides):
    kw = dict(block_size=128, num_kv_heads=1, head_size=576, dtype=torch.int8, rope_head_dim=64, scale_dim=4,
              scale_dtype=torch.float32, sparse_c8=True)
    kw.update(overrides)
    return AscendMLAAttentionSpec.create(ratio=ratio, **kw)


def test_page_size_follows_the_storage_formula():
    spec = c8(ratio=4)
    assert spec.ratio == mla_ratio(spec) == 4
    assert spec.storage_block_size == 32
    assert spec.page_size_bytes == 32 * 1 * (576 * 1 + 4 * 4)
    # vLLM's own grid (used by its planner and views) agrees with ours.
    assert spec.num_states * spec.num_heads * spec.state_content_size_bytes == spec.page_size_bytes
    plain = AscendMLAAttentionSpec.create(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    assert plain.page_size_bytes == 64 * 576 * 2 and plain.storage_block_size == 64


def test_alignment_pads_the_page_like_vllm_mla():
    spec = c8(ratio=4, alignment=4096)
    assert spec.page_size_bytes == 20480 and spec.real_page_size_bytes == 32 * 592


@pytest.mark.parametrize(("field", "value"), [("scale_dim", 2), ("sparse_c8", False), ("host_resident", True),
                                              ("rope_head_dim", 32), ("tokens_per_state", 2)])
def test_merge_error_names_the_differing_field(field, value):
    base = c8()
    other = dataclasses.replace(base, **{field: value})
    pattern = rf"field '{field}' differs between layers: .* \(spec 0\) vs .*\(spec 1\)"
    with pytest.raises(KVSpecMergeError, match=pattern):
        AscendMLAAttentionSpec.merge([base, other])


def test_merge_of_equal_specs_and_of_different_kinds():
    assert AscendMLAAttentionSpec.merge([c8(), c8()]) == c8()
    indexer = AscendSparseIndexerSpec.create(ratio=4, block_size=128, num_kv_heads=1, head_size=128,
                                             dtype=torch.bfloat16, scale_dim=1, scale_dtype=torch.float32)
    with pytest.raises(AssertionError, match="spec type differs"):  # the planner probes with AssertionError
        AscendMLAAttentionSpec.merge([c8(), indexer])


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(scale_dim=4, scale_dtype=None), "needs a scale_dtype"),
    (dict(sparse_c8=True, dtype=torch.bfloat16), "sparse_c8 needs dtype=torch.int8"),
    (dict(rope_head_dim=600), "rope_head_dim=600 exceeds head_size=576"),
    (dict(block_size=130), "block_size=130 is not a multiple of the ratio 4"),
])
def test_invalid_specs_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        c8(**kwargs)


def test_ratio_goes_through_the_lane_adapter():
    # vLLM's own MLA spec, whichever lane this is (compress_ratio on 0.27.1, tokens_per_state on 0.32.0)
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_core.upstream import mla_ratio_field, mla_ratio_kwargs

    spec = MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                            **mla_ratio_kwargs(4, MLAAttentionSpec))
    assert mla_ratio(spec) == 4
    assert [f.name for f in dataclasses.fields(c8())].count(mla_ratio_field(MLAAttentionSpec)) == 1


def test_registration_is_explicit_and_idempotent(vllm_config):
    assert register_ascend_kv_specs() is True
    assert register_ascend_kv_specs() is True
    assert KVCacheSpecRegistry.get_manager_class(c8()) is FullAttentionManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(c8()) is FullAttentionSpec
    swa = AscendSlidingWindowMLASpec.create(block_size=64, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                                            sliding_window=128)
    assert KVCacheSpecRegistry.get_manager_class(swa) is SlidingWindowManager
    assert KVCacheSpecRegistry.get_uniform_type_base_spec(swa) is SlidingWindowMLASpec
    # Built-in specs stay registered (the registry only fills itself while empty).
    assert KVCacheSpecRegistry.get_manager_class(FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64,
                                                                   dtype=torch.float16)) is FullAttentionManager


def test_sliding_window_mla_hybrid_plans_two_groups(plan):
    kw = dict(block_size=32, num_kv_heads=1, head_size=576, dtype=torch.bfloat16, rope_head_dim=64)
    specs = {f"model.layers.{i}.attn": (AscendSlidingWindowMLASpec.create(sliding_window=64, **kw) if i % 2
                                        else AscendMLAAttentionSpec.create(**kw)) for i in range(4)}
    config = plan(specs, 4 << 20)
    kinds = sorted(type(g.kv_cache_spec).__name__ for g in config.kv_cache_groups)
    assert kinds == ["AscendMLAAttentionSpec", "AscendSlidingWindowMLASpec"]


def test_vllms_mla_spec_becomes_ours_with_the_same_page_and_views():
    from vllm.v1.kv_cache_interface import MLAAttentionSpec

    from ascend_core.kv.specs import AscendMLAAttentionSpec, ascend_mla_spec
    from ascend_core.kv.views import MLAKV, build_layer_kv

    theirs = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.float32)
    ours = ascend_mla_spec(theirs, rope_head_dim=64)
    assert type(ours) is AscendMLAAttentionSpec and ours.rope_head_dim == 64 and ours.ratio == 1
    assert ours.page_size_bytes == theirs.page_size_bytes == 16 * 576 * 4
    assert ascend_mla_spec(ours, rope_head_dim=64) is ours

    backing = torch.arange(3 * 16 * 576, dtype=torch.int32).view(torch.int8)
    byte_view = backing.view(3, 1, 16, 576 * 4)  # [B, H, N, C] bytes, as the allocator cuts it
    from_spec = build_layer_kv(byte_view, ours, "layer.0")  # packed cells (layers no backend lays out as planes)
    assert isinstance(from_spec, MLAKV) and from_spec.latent.shape == (3, 16, 1, 512)
    assert from_spec.rope.shape == (3, 16, 1, 64)
    cells = backing.view(torch.float32).view(3, 16, 576)
    assert torch.equal(from_spec.latent[:, :, 0], cells[..., :512]) and torch.equal(from_spec.rope[:, :, 0],
                                                                                     cells[..., 512:])


@pytest.mark.parametrize("order", [(0, 1, 2, 3), (0, 2, 1, 3)])  # LBHNC, LBNHC pages
def test_attention_views_of_the_layer_tensor_are_the_allocators(order):
    from ascend_core.kv.errors import KVLayoutError
    from ascend_core.kv.views import AttentionKV, attention_kv_of, build_layer_kv, vllm_layer_view

    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=32, dtype=torch.float16)
    logical = (3, 2, 16, 64 * 2)  # [B, H, N, C bytes]: K then V per state
    physical = torch.zeros(*(logical[i] for i in order), dtype=torch.int8)
    byte_view = physical.permute(*(order.index(i) for i in range(4)))
    from_spec = build_layer_kv(byte_view, spec, "layer.0")
    from_tensor = attention_kv_of(vllm_layer_view(byte_view, spec), 32)  # what vLLM hands the layer
    assert isinstance(from_spec, AttentionKV) and from_spec.key.shape == (3, 16, 2, 32)
    for a, b in ((from_spec.key, from_tensor.key), (from_spec.value, from_tensor.value)):
        assert (a.shape, a.stride(), a.data_ptr()) == (b.shape, b.stride(), b.data_ptr())
    with pytest.raises(KVLayoutError, match="cannot hold a key of 64"):
        attention_kv_of(vllm_layer_view(byte_view, spec), 64)
