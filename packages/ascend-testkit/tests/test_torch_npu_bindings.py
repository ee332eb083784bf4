"""Every torch_npu binding of `ascend_kernels.npu_backend`, run over the testkit's schema-faithful torch_npu, against
the reference backend on the same inputs; and the fake's own contract (schema errors, the meta check, counters)."""

from __future__ import annotations

import pytest
import torch

import ascend_kernels
from ascend_kernels import npu_backend, npu_probe, npu_usage, registry
from ascend_kernels import reference as ref
from ascend_testkit import torch_npu as fake

TOL = {"atol": 2e-5, "rtol": 2e-5}


@pytest.fixture(autouse=True)
def _fresh_counts(torch_npu):  # the fake installed by conftest's `torch_npu`
    fake.reset_calls()
    npu_usage.reset()


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def _paged_batch(seed=0, block_size=4, heads=4, kv_heads=2, dim=8):
    """A decode (1 query over 9 keys: 3 blocks, the last partial), a prefill chunk (5 queries over 8 keys: exactly two
    blocks) and a fresh prefill (3 over 3); two padding rows. Dense caches [blocks, block_size, kv_heads, dim]."""
    g = _gen(seed)
    key_cache = torch.randn(12, block_size, kv_heads, dim, generator=g)
    value_cache = torch.randn(12, block_size, kv_heads, dim, generator=g)
    block_table = torch.tensor([[3, 7, 1], [0, 5, 11], [9, 2, 4]], dtype=torch.int32)
    starts, lens = [0, 1, 6, 9], [9, 8, 3]
    query = torch.randn(11, heads, dim, generator=g)
    return dict(query=query, key_cache=key_cache, value_cache=value_cache, block_table=block_table,
                query_start_loc=torch.tensor(starts, dtype=torch.int32), seq_lens=torch.tensor(lens, dtype=torch.int32),
                query_start_loc_host=starts, seq_lens_host=lens)


@pytest.mark.parametrize("variant", ["causal", "sliding_window", "sinks"])
def test_paged_attention_matches_reference(variant):
    args = _paged_batch()
    extra = {"sliding_window": 3} if variant == "sliding_window" else {}
    if variant == "sinks":
        extra["sinks"] = torch.randn(4, generator=_gen(1))
    got = npu_backend.paged_attention(**args, scale=0.3, **extra)
    want = ref.paged_attention(**args, scale=0.3, **extra)
    torch.testing.assert_close(got, want, **TOL)
    assert fake.calls() == {"npu_fused_infer_attention_score_v2": 1}
    assert npu_usage.snapshot()["fallbacks"] == {}


def _paged_planes(args: dict) -> dict:
    """The same caches as a hybrid's paged planes: block b's K page then its V page inside one block page
    (`ascend_core.kv.planes`), so each plane is a view whose blocks sit two pages apart."""
    pages = torch.stack([args["key_cache"], args["value_cache"]], dim=1)  # [blocks, 2, block_size, heads, dim]
    return args | {"key_cache": pages[:, 0], "value_cache": pages[:, 1]}


@pytest.mark.parametrize("variant", ["causal", "sliding_window", "sinks"])
@pytest.mark.parametrize("budget", [None, 1])  # one kernel call for the step, or one per request (budget 1 byte)
def test_paged_planes_run_the_kernel_on_gathered_blocks(monkeypatch, variant, budget):
    from ascend_kernels import npu_paged_planes

    if budget is not None:
        monkeypatch.setattr(npu_paged_planes, "GATHER_BUDGET_BYTES", budget)
    args = _paged_planes(_paged_batch())
    assert not args["key_cache"].is_contiguous()
    extra = {"sliding_window": 3} if variant == "sliding_window" else {}
    if variant == "sinks":
        extra["sinks"] = torch.randn(4, generator=_gen(1))
    out = torch.full((11, 4, 8), float("nan"))
    got = npu_backend.paged_attention(**args, scale=0.3, out=out, **extra)
    assert got is out
    torch.testing.assert_close(got, ref.paged_attention(**args, scale=0.3, **extra), **TOL)
    assert fake.calls() == {"npu_fused_infer_attention_score_v2": 1 if budget is None else 3}
    usage = npu_usage.snapshot()
    assert usage["fallbacks"] == {} and usage["paged_planes"] == {"paged_attention": 1}


def test_request_pieces_stay_within_the_budget():
    from ascend_kernels.npu_paged_planes import request_pieces

    # blocks of 4 tokens, 10 bytes each: contexts of 1, 3, 2, 5 and 1 blocks
    assert request_pieces([4, 9, 8, 17, 1], 4, 10, budget=60) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert request_pieces([4, 9, 8, 17, 1], 4, 10, budget=10**9) == [(0, 5)]
    assert request_pieces([17], 4, 10, budget=1) == [(0, 1)]  # a request over the budget alone
    assert request_pieces([], 4, 10) == []


def test_cache_write_matches_reference():
    g = _gen(2)
    key, value = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    slots = torch.tensor([0, 3, 4, 13, 22], dtype=torch.int64)  # block edges: slot 3 ends block 0, 4 starts block 1
    caches = [torch.zeros(6, 4, 2, 8) for _ in range(4)]
    npu_backend.reshape_and_cache(key, value, caches[0], caches[1], slots)
    ref.reshape_and_cache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    latent, rope = torch.randn(5, 16, generator=g), torch.randn(5, 4, generator=g)
    mla = [torch.zeros(6, 4, 1, 16), torch.zeros(6, 4, 1, 4), torch.zeros(6, 4, 1, 16), torch.zeros(6, 4, 1, 4)]
    npu_backend.reshape_and_cache_mla(latent, rope, mla[0], mla[1], slots)
    ref.reshape_and_cache_mla(latent, rope, mla[2], mla[3], slots)
    assert torch.equal(mla[0], mla[2]) and torch.equal(mla[1], mla[3])
    assert fake.calls() == {"_npu_reshape_and_cache": 2}


def test_cache_write_into_paged_planes_matches_reference():
    """A hybrid's strided planes are written in place by slot (no fallback, no dense kernel); padding goes to the
    null block's slot 0 as on dense caches."""
    g = _gen(5)
    key, value = torch.randn(5, 2, 8, generator=g), torch.randn(5, 2, 8, generator=g)
    slots = torch.tensor([3, -1, 4, 13, 22], dtype=torch.int64)
    ours, want = torch.zeros(6, 2, 4, 2, 8), torch.zeros(6, 2, 4, 2, 8)
    npu_backend.reshape_and_cache(key, value, ours[:, 0], ours[:, 1], slots)
    ref.reshape_and_cache(key, value, want[:, 0], want[:, 1], slots)
    assert torch.equal(ours[1:], want[1:]) and torch.equal(ours[0, :, 1:], want[0, :, 1:])
    assert fake.calls() == {}
    usage = npu_usage.snapshot()
    assert usage["fallbacks"] == {} and usage["paged_planes"] == {"reshape_and_cache": 1}


def test_padding_slots_land_in_the_null_block_not_in_a_request_block():
    # vLLM pads a batch with slot -1 (dummy and padded steps). ATB takes no skip value, so the binding sends padding
    # to slot 0 (vLLM's null block, never a request's) without reading the slots back; the fake refuses -1 itself.
    g = _gen(4)
    key, value = torch.randn(4, 2, 8, generator=g), torch.randn(4, 2, 8, generator=g)
    slots = torch.tensor([5, -1, 9, -1], dtype=torch.int64)
    caches = [torch.zeros(6, 4, 2, 8) for _ in range(4)]
    npu_backend.reshape_and_cache(key, value, caches[0], caches[1], slots)
    ref.reshape_and_cache(key, value, caches[2], caches[3], slots)
    assert torch.equal(caches[0][1:], caches[2][1:]) and torch.equal(caches[1][1:], caches[3][1:])  # request blocks
    assert torch.equal(caches[0][0, 1:], caches[2][0, 1:])  # the null block beyond its slot 0 untouched too
    with pytest.raises(Exception, match="slot_indices must lie in"):
        torch_npu_module()._npu_reshape_and_cache(key, value, caches[0], caches[1], slots.to(torch.int32))


def torch_npu_module():
    import torch_npu

    return torch_npu


def _mla_caches(seed=3):
    g = _gen(seed)
    return (torch.randn(8, 4, 1, 16, generator=g), torch.randn(8, 4, 1, 4, generator=g),
            torch.tensor([[2, 5, 0], [7, 1, 3]], dtype=torch.int32), torch.tensor([9, 4], dtype=torch.int32))


def test_mla_decode_and_gather_match_reference():
    latent, rope, table, lens = _mla_caches()
    g = _gen(4)
    q_nope, q_rope = torch.randn(2, 3, 16, generator=g), torch.randn(2, 3, 4, generator=g)
    got = npu_backend.mla_decode_attention(q_nope, q_rope, latent, rope, table, lens, scale=0.25)
    torch.testing.assert_close(got, ref.mla_decode_attention(q_nope, q_rope, latent, rope, table, lens, scale=0.25),
                               **TOL)
    got_latent, got_rope = npu_backend.gather_mla_cache(latent, rope, table, lens)
    want_latent, want_rope = ref.gather_mla_cache(latent, rope, table, lens)
    assert torch.equal(got_latent, want_latent) and torch.equal(got_rope, want_rope)
    # key/value given: the dispatcher binds the out= overload
    assert fake.calls() == {"npu_fused_infer_attention_score": 1, "npu_paged_cache_load.out": 1}


def test_mla_prefill_and_attention_with_lse_and_merge_match_reference():
    g = _gen(5)
    starts, kv_starts = [0, 3, 5], [0, 4, 9]
    q, k_nope = torch.randn(6, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g)
    k_rope, v = torch.randn(9, 4, generator=g), torch.randn(9, 2, 8, generator=g)
    qsl, ksl = torch.tensor(starts), torch.tensor(kv_starts)
    q_full = torch.randn(6, 2, 12, generator=g)
    got = npu_backend.mla_prefill_attention(q_full, k_nope, k_rope, v, qsl, ksl, scale=0.3)
    torch.testing.assert_close(got, ref.mla_prefill_attention(q_full, k_nope, k_rope, v, qsl, ksl, scale=0.3), **TOL)
    k = torch.randn(9, 2, 8, generator=g)
    parts = []
    for causal in (True, False):
        got_out, got_lse = npu_backend.attention_with_lse(q, k, v, qsl, ksl, scale=0.3, causal=causal)
        want_out, want_lse = ref.attention_with_lse(q, k, v, qsl, ksl, scale=0.3, causal=causal)
        torch.testing.assert_close(got_out, want_out, **TOL)
        torch.testing.assert_close(got_lse[:5], want_lse[:5], **TOL)
        parts.append((got_out[:5], got_lse[:5]))
    merged, total = npu_backend.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    want_merged, want_total = ref.merge_attention_states([p[0] for p in parts], [p[1] for p in parts])
    torch.testing.assert_close(merged, want_merged, **TOL)
    torch.testing.assert_close(total, want_total, **TOL)
    assert fake.calls() == {"npu_fused_infer_attention_score": 3, "npu_attention_update": 1}


def test_paged_attention_with_lse_matches_reference():
    args = _paged_batch(seed=6)
    got_out, got_lse = npu_backend.paged_attention_with_lse(**args, scale=0.3)
    want_out, want_lse = ref.paged_attention_with_lse(**args, scale=0.3)
    torch.testing.assert_close(got_out, want_out, **TOL)
    torch.testing.assert_close(got_lse[:9], want_lse[:9], **TOL)


def test_context_parallel_bindings_take_what_pcp_hands_them():
    """Under PCP the query is split from the fused qkv projection and the step's keys and values are halves of the
    all-gathered K|V rows (`gather_kv_rows`): strided views, which FIA refuses (it takes dense q/k/v)."""
    g = _gen(7)
    qkv = torch.randn(6, 4 * 8 + 2 * 2 * 8, generator=g)
    q = qkv[:, : 4 * 8].view(6, 4, 8)  # [tokens, heads, dim], row stride of the fused projection
    packed = torch.randn(12, 2, 16, generator=g)  # [gathered tokens, kv heads, key | value]
    k, v = ref.gather_kv_rows(packed, torch.tensor([3, 0, 7, 1, 2, 9, 4, 5, 6]), key_size=8)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    qsl, ksl = torch.tensor([0, 3, 5]), torch.tensor([0, 4, 9])
    got_out, got_lse = npu_backend.attention_with_lse(q, k, v, qsl, ksl, scale=0.3)
    want_out, want_lse = ref.attention_with_lse(q, k, v, qsl, ksl, scale=0.3)
    torch.testing.assert_close(got_out, want_out, **TOL)
    torch.testing.assert_close(got_lse, want_lse, **TOL)
    args = _paged_batch(seed=8)
    args["query"] = torch.randn(11, 6, 8, generator=g)[:, :4]  # a strided [tokens, heads, dim] view
    got_out, got_lse = npu_backend.paged_attention_with_lse(**args, scale=0.3, causal=False)
    want_out, want_lse = ref.paged_attention_with_lse(**args, scale=0.3, causal=False)
    torch.testing.assert_close(got_out, want_out, **TOL)
    torch.testing.assert_close(got_lse[:9], want_lse[:9], **TOL)
    assert fake.calls() == {"npu_fused_infer_attention_score": 2} and npu_usage.snapshot()["fallbacks"] == {}


def test_attention_over_padding_rows_only_launches_nothing():
    """A PCP rank can be handed none of a step's tokens: its attention calls carry padding rows only."""
    args = _paged_batch()
    args.update(query_start_loc=torch.zeros(4, dtype=torch.int32), query_start_loc_host=[0, 0, 0, 0])
    out = torch.full((11, 4, 8), 7.0)
    assert npu_backend.paged_attention(**args, scale=0.3, out=out) is out and not out.any()
    out, lse = npu_backend.paged_attention_with_lse(**args, scale=0.3)
    assert not out.any() and torch.isneginf(lse).all()
    q, kv = torch.randn(3, 4, 8), torch.randn(5, 2, 8)
    out, lse = npu_backend.attention_with_lse(q, kv, kv, torch.zeros(2, dtype=torch.int32), torch.tensor([0, 5]),
                                              scale=0.3)
    assert out.shape == (3, 4, 8) and not out.any() and torch.isneginf(lse).all()
    assert fake.calls() == {} and npu_usage.snapshot()["fallbacks"] == {}


@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_norms_and_swiglu_match_reference(is_neox):
    g = _gen(7)
    positions = torch.tensor([0, 5, 17, 3])
    cache = torch.randn(32, 8, generator=g)
    q, k = torch.randn(4, 3, 8, generator=g), torch.randn(4, 1, 8, generator=g)
    q2, k2 = q.clone(), k.clone()
    npu_backend.rotary_embedding(positions, q, k, cache, head_size=8, rotary_dim=8, is_neox=is_neox)
    ref.rotary_embedding(positions, q2, k2, cache, head_size=8, rotary_dim=8, is_neox=is_neox)
    torch.testing.assert_close(q, q2, **TOL)
    torch.testing.assert_close(k, k2, **TOL)
    x, res, w = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g), torch.randn(16, generator=g)
    torch.testing.assert_close(npu_backend.rms_norm(x, w, 1e-6), ref.rms_norm(x, w, 1e-6), **TOL)
    for got, want in zip(npu_backend.rms_norm(x, w, 1e-6, res), ref.rms_norm(x, w, 1e-6, res), strict=True):
        torch.testing.assert_close(got, want, **TOL)
    torch.testing.assert_close(npu_backend.silu_and_mul(x), ref.silu_and_mul(x), **TOL)
    assert fake.calls() == {"_npu_rotary_embedding": 1, "npu_rms_norm": 1, "npu_add_rms_norm": 1, "npu_swiglu": 1}


def test_rotary_of_q_and_k_split_from_a_fused_projection_runs_the_kernel_in_place():
    """vLLM's q and k are strided views of one qkv row: rotated as dense copies, written back into the views."""
    g = _gen(8)
    positions = torch.tensor([0, 5, 17])
    cache = torch.randn(32, 8, generator=g)
    qkv = torch.randn(3, (3 + 1 + 1) * 8, generator=g)
    expected = qkv.clone()
    views = [t.view(3, -1, 8) for t in qkv.split([24, 8, 8], dim=-1)[:2]]
    ref_views = [t.view(3, -1, 8) for t in expected.split([24, 8, 8], dim=-1)[:2]]
    assert not views[0].is_contiguous()
    npu_backend.rotary_embedding(positions, *views, cache, head_size=8, rotary_dim=8, is_neox=True)
    ref.rotary_embedding(positions, *ref_views, cache, head_size=8, rotary_dim=8, is_neox=True)
    torch.testing.assert_close(qkv, expected, **TOL)
    assert fake.calls() == {"_npu_rotary_embedding": 1} and npu_usage.snapshot()["fallbacks"] == {}


def test_partial_rotary_falls_back_visibly():
    q, k = torch.randn(2, 2, 8), torch.randn(2, 1, 8)
    npu_backend.rotary_embedding(torch.tensor([0, 1]), q, k, torch.randn(4, 4), head_size=8, rotary_dim=4,
                                 is_neox=True)
    assert npu_usage.snapshot()["fallbacks"] == {"rotary_embedding": 1} and fake.calls() == {}


@pytest.mark.parametrize("case", ["softmax", "sigmoid_bias_grouped", "sigmoid_no_renorm", "scaled"])
def test_moe_routing_matches_reference(case):
    logits = torch.randn(5, 24, generator=_gen(8))
    kwargs = {
        "softmax": dict(scoring_func="softmax", renormalize=True),
        "sigmoid_bias_grouped": dict(scoring_func="sigmoid", renormalize=True, num_expert_group=4, topk_group=2,
                                     e_score_correction_bias=torch.randn(24, generator=_gen(9))),
        "sigmoid_no_renorm": dict(scoring_func="sigmoid", renormalize=False),
        "scaled": dict(scoring_func="softmax", renormalize=False, routed_scaling_factor=2.5),
    }[case]
    got_w, got_ids = npu_backend.moe_gating_topk(logits, 3, **kwargs)
    want_w, want_ids = ref.moe_gating_topk(logits, 3, **kwargs)
    assert torch.equal(got_ids, want_ids)
    torch.testing.assert_close(got_w, want_w, **TOL)
    assert fake.calls() == {"npu_moe_gating_top_k": 1} and npu_usage.snapshot()["fallbacks"] == {}


def test_sqrtsoftplus_routing_falls_back_visibly():
    npu_backend.moe_gating_topk(torch.randn(2, 12), 2, scoring_func="sqrtsoftplus")
    assert npu_usage.snapshot()["fallbacks"] == {"moe_gating_topk": 1}


@pytest.mark.parametrize("with_bias", [False, True])
def test_fused_moe_matches_reference_including_dropped_pairs(with_bias):
    g = _gen(10)
    x = torch.randn(6, 8, generator=g)
    w13, w2 = torch.randn(4, 12, 8, generator=g), torch.randn(4, 8, 6, generator=g)
    ids = torch.tensor([[0, 2], [3, -1], [2, 2], [1, 0], [-1, -1], [3, 1]], dtype=torch.int32)
    weights = torch.rand(6, 2, generator=g)
    bias = dict(w13_bias=torch.randn(4, 12, generator=g), w2_bias=torch.randn(4, 8, generator=g)) if with_bias else {}
    got = npu_backend.fused_moe(x, w13, w2, weights, ids, **bias)
    torch.testing.assert_close(got, ref.fused_moe(x, w13, w2, weights, ids, **bias), atol=1e-4, rtol=1e-4)
    assert fake.calls() == {"npu_moe_init_routing_v2": 1, "npu_grouped_matmul": 2, "npu_swiglu": 1,
                            "npu_moe_token_unpermute": 1}


def test_sampling_filter_matches_reference_filter():
    g = _gen(11)
    logits = torch.randn(4, 50, generator=g)
    top_k = torch.tensor([5, 0, 50, 12])
    top_p = torch.tensor([0.9, 0.5, 1.0, 0.3])
    got = npu_backend.top_k_top_p(logits, top_k, top_p)
    want = ref.top_k_top_p(logits, top_k, top_p)
    assert torch.equal(got.isinf(), want.isinf()) and int(got.isinf().sum()) > 50
    torch.testing.assert_close(got[~got.isinf()], want[~want.isinf()])
    assert fake.calls() == {"npu_top_k_top_p": 1}


def test_sampling_filter_past_the_kernels_k_range_falls_back_counted():
    logits = torch.randn(2, 3000, generator=_gen(12))
    top_k = torch.tensor([1500, 0])  # 1500 > 1024, and row 1 unlimited
    got = npu_backend.top_k_top_p(logits, top_k, None)
    assert torch.equal(got, ref.top_k_top_p(logits, top_k, None))
    assert fake.calls() == {} and npu_usage.snapshot()["fallbacks"].get("top_k_top_p") == 1


def test_facade_selects_npu_over_the_fake(monkeypatch):
    npu_probe.torch_npu_status.cache_clear()
    monkeypatch.setattr(registry._STATE, "loaded", {})
    assert npu_probe.torch_npu_status().usable
    x, w = torch.randn(2, 8), torch.ones(8)
    with ascend_kernels.use_backend("npu"):
        ascend_kernels.ops.rms_norm(x, w, 1e-6)
    assert fake.calls() == {"npu_rms_norm": 1} and npu_usage.snapshot()["npu_ops"] == {"npu_rms_norm": 1}
