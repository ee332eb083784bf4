"""Property tests: random mixes of specs, planned by vLLM's own planner, allocated shared and private, keep every
invariant (tags read back at descriptor offsets, no overlap within a group, vLLM parity, private within budget)."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

from ascend_core.kv.allocator import allocate_kv_caches, scale_budget_for_private
from ascend_core.kv.specs import AscendMLAAttentionSpec, AscendSlidingWindowMLASpec


@st.composite
def spec_mixes(draw):
    block = draw(st.sampled_from([32, 64]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    heads, head = draw(st.sampled_from([1, 2, 4])), draw(st.sampled_from([32, 64]))
    kinds = draw(st.lists(st.sampled_from(["full", "swa", "mla", "swa_mla", "mamba"]), min_size=1, max_size=3,
                          unique=True))
    ratio = draw(st.sampled_from([1, 2, 4]))
    scale = draw(st.sampled_from([0, 2]))
    window = draw(st.sampled_from([64, 128]))
    specs, index = {}, 0
    for kind in kinds:
        for _ in range(draw(st.integers(1, 4))):
            name = f"model.layers.{index}.{kind}"
            index += 1
            attn = dict(block_size=block, num_kv_heads=heads, head_size=head, dtype=dtype)
            mla = dict(block_size=block, num_kv_heads=1, head_size=head * 4, dtype=dtype, rope_head_dim=head // 2,
                       scale_dim=scale, scale_dtype=torch.float32 if scale else None)
            specs[name] = {
                "full": lambda a=attn: FullAttentionSpec(**a),
                "swa": lambda a=attn: SlidingWindowSpec(sliding_window=window, **a),
                "mla": lambda m=mla: AscendMLAAttentionSpec.create(ratio=ratio, **m),
                "swa_mla": lambda m=mla: AscendSlidingWindowMLASpec.create(sliding_window=window, **m),
                "mamba": lambda: MambaSpec(block_size=128, shapes=((2, head), (heads, 8, 8)), dtypes=(dtype, dtype)),
            }[kind]()
    layout = draw(st.sampled_from(["LBHNC", "LBNHC", "BLHNC", "BLNHC"]))
    memory = draw(st.integers(768, 2048)) << 10
    return specs, layout, memory


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(mix=spec_mixes())
def test_random_mixes_keep_the_invariants(plan, kv_checks, mix):
    specs, layout, memory = mix
    try:
        config = plan(specs, memory, layout)
    except (ValueError, NotImplementedError, StopIteration, AssertionError):
        # vLLM's planner refuses some mixes (mixed pages under layer-outer layouts, too little memory...); its
        # block-outermost packing also trips on some unbalanced mixes (vLLM 0.32: StopIteration in
        # UniformTypeKVCacheSpecs.from_specs, "Some layers are not assigned to any group"): nothing to allocate.
        assume(False)
    assume(config.num_blocks >= 2)
    alloc = allocate_kv_caches(config, device="cpu")
    assert set(alloc.layers) == set(specs)
    kv_checks.parity(config, alloc, layout)
    kv_checks.overlay(config, alloc)
    kv_checks.tags(config, alloc)

    scaled = scale_budget_for_private(config, memory)
    try:
        private_config = plan(specs, scaled, layout)
    except ValueError:
        assume(False)  # too little memory left for max_model_len once every layer pays for its own pages
    private = allocate_kv_caches(private_config, device="cpu", mode="private")
    assert private.nbytes <= memory
    kv_checks.tags(private_config, private, mode="private")
