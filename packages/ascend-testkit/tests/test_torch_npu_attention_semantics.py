"""The attention family's CPU semantics against a plain float64 per-request softmax loop, and each refusal."""

from __future__ import annotations

import inspect
import math
import re

import pytest
import torch

from ascend_testkit.torch_npu.attention import CARD, IMPLEMENTATIONS, TINY_MODELS, implementations

TINY = implementations(TINY_MODELS)
MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)


def reference(q, keys, values, q_lens, *, scale, causal=True, window=None, sink=None, q_rope=None, k_ropes=None):
    """q [T, N, D] packed; keys/values per request [kv_len, KV_N, D]; queries are each request's last positions.

    Returns out [T, N, Dv], lse [T, N]: one softmax per (token, head), written as plainly as possible.
    """
    heads = q.shape[1]
    out = torch.zeros(q.shape[0], heads, values[0].shape[-1], dtype=torch.float64)
    lse = torch.full((q.shape[0], heads), float("-inf"), dtype=torch.float64)
    start = 0
    for b, q_len in enumerate(q_lens):
        k, v = keys[b].double(), values[b].double()
        kv_len, group = k.shape[0], heads // k.shape[1]
        for i in range(q_len):
            pos = kv_len - q_len + i
            seen = [j for j in range(kv_len) if (not causal or j <= pos) and (window is None or pos - j < window)]
            for h in range(heads):
                logits = [scale * float(q[start + i, h].double() @ k[j, h // group]) for j in seen]
                if q_rope is not None:
                    logits = [x + scale * float(q_rope[start + i, h].double() @ k_ropes[b][j, h // group].double())
                              for x, j in zip(logits, seen, strict=True)]
                extra = [] if sink is None else [float(sink[h])]
                if not logits:
                    continue
                top = max(logits + extra)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights) + sum(math.exp(x - top) for x in extra)
                out[start + i, h] = sum(w * v[j, h // group] for w, j in zip(weights, seen, strict=True)) / total
                lse[start + i, h] = top + math.log(total)
        start += q_len
    return out, lse


def paged(per_request, block_size, *, num_blocks=None, four_d=False, seed=0):
    """Scatter per-request [len, KV_N, D] rows into a block cache through a shuffled block table (by hand)."""
    needs = [-(-t.shape[0] // block_size) for t in per_request]
    num_blocks = num_blocks or sum(needs) + 2
    order = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    heads, dim = per_request[0].shape[1:]
    cache = torch.zeros(num_blocks, block_size, heads, dim, dtype=per_request[0].dtype)
    table = torch.zeros(len(per_request), max(needs), dtype=torch.int32)
    used = 0
    for b, rows in enumerate(per_request):
        for n in range(needs[b]):
            block = int(order[used])
            used += 1
            table[b, n] = block
            chunk = rows[n * block_size:(n + 1) * block_size]
            cache[block, :chunk.shape[0]] = chunk
    if four_d:
        return cache.permute(0, 2, 1, 3).contiguous(), table
    return cache.reshape(num_blocks, block_size, heads * dim), table


def batch(q_lens, kv_lens, heads, kv_heads, dim, dtype, *, value_dim=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, dim, generator=g).to(dtype)
    keys = [torch.randn(n, kv_heads, dim, generator=g).to(dtype) for n in kv_lens]
    values = [torch.randn(n, kv_heads, value_dim or dim, generator=g).to(dtype) for n in kv_lens]
    return q, keys, values


def cumsum(lengths):
    return [sum(lengths[:i + 1]) for i in range(len(lengths))]


# -- paged TND attention (vLLM's mixed prefill/decode batch) -------------------------------------------------------

@pytest.mark.parametrize("four_d", [False, True])
def test_v2_paged_tnd_mixes_prefill_and_decode_with_gqa_across_block_edges(four_d):
    q_lens, kv_lens, bs = [5, 1, 3, 1], [9, 4, 8, 13], 4  # chunked prefill, decodes; lengths off block edges
    q, keys, values = batch(q_lens, kv_lens, heads=4, kv_heads=2, dim=8, dtype=torch.float32)
    k_cache, table = paged(keys, bs, four_d=four_d)
    v_cache, _ = paged(values, bs, four_d=four_d)
    out, lse = TINY["npu_fused_infer_attention_score_v2"](
        q, k_cache, v_cache, num_query_heads=4, num_key_value_heads=2, input_layout="TND", softmax_scale=0.3,
        block_table=table, block_size=bs, actual_seq_qlen=cumsum(q_lens), actual_seq_kvlen=kv_lens,
        atten_mask=MASK, sparse_mode=3)
    expected, _ = reference(q, keys, values, q_lens, scale=0.3)
    assert out.shape == (sum(q_lens), 4, 8) and out.dtype == torch.float32 and lse.numel() == 0
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_v1_paged_tnd_lse_matches_the_loop_and_has_shape_t_n_1():
    q_lens, kv_lens, bs = [3, 1], [130, 128], 128  # the card's block size; 130 crosses a block edge
    q, keys, values = batch(q_lens, kv_lens, heads=2, kv_heads=1, dim=16, dtype=torch.bfloat16)
    k_cache, table = paged(keys, bs)
    v_cache, _ = paged(values, bs)
    out, lse = IMPLEMENTATIONS["npu_fused_infer_attention_score"](
        q, k_cache, v_cache, num_heads=2, num_key_value_heads=1, input_layout="TND", scale=0.25,
        block_table=table, block_size=bs, actual_seq_lengths=cumsum(q_lens), actual_seq_lengths_kv=kv_lens,
        atten_mask=MASK, sparse_mode=3, softmax_lse_flag=True)
    expected, expected_lse = reference(q, keys, values, q_lens, scale=0.25)
    assert lse.shape == (4, 2, 1) and lse.dtype == torch.float32 and out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[..., 0].double(), expected_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("window", [1, 3, 6])
def test_band_mode_4_from_the_bottom_right_is_a_sliding_window_of_pre_tokens_plus_one(window):
    q_lens, kv_lens, bs = [6, 1, 2], [10, 7, 5], 4
    q, keys, values = batch(q_lens, kv_lens, heads=2, kv_heads=2, dim=8, dtype=torch.float32, seed=3)
    k_cache, table = paged(keys, bs)
    v_cache, _ = paged(values, bs)
    out, _ = TINY["npu_fused_infer_attention_score"](
        q, k_cache, v_cache, num_heads=2, num_key_value_heads=2, input_layout="TND", scale=0.5, block_table=table,
        block_size=bs, actual_seq_lengths=cumsum(q_lens), actual_seq_lengths_kv=kv_lens, atten_mask=MASK,
        sparse_mode=4, pre_tokens=window - 1, next_tokens=0)
    expected, _ = reference(q, keys, values, q_lens, scale=0.5, window=window)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


def test_learnable_sink_joins_the_normalizer_only():
    q_lens, kv_lens, bs = [2, 1], [6, 3], 4
    q, keys, values = batch(q_lens, kv_lens, heads=2, kv_heads=1, dim=8, dtype=torch.float32, seed=5)
    k_cache, table = paged(keys, bs)
    v_cache, _ = paged(values, bs)
    sink = torch.tensor([0.5, 3.0])
    out, lse = TINY["npu_fused_infer_attention_score_v2"](
        q, k_cache, v_cache, num_query_heads=2, num_key_value_heads=1, input_layout="TND", softmax_scale=0.4,
        block_table=table, block_size=bs, actual_seq_qlen=cumsum(q_lens), actual_seq_kvlen=kv_lens,
        atten_mask=MASK, sparse_mode=3, learnable_sink=sink, return_softmax_lse=True)
    expected, expected_lse = reference(q, keys, values, q_lens, scale=0.4, sink=sink)
    without, _ = reference(q, keys, values, q_lens, scale=0.4)
    assert not torch.allclose(expected, without)  # the sink must matter for this check to mean anything
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[..., 0].double(), expected_lse, atol=1e-5, rtol=1e-5)


# -- dense layouts --------------------------------------------------------------------------------------------------

def test_unpaged_tnd_causal_prefill_with_cumulative_kv_on_the_card_shapes():
    q_lens, kv_lens = [3, 5], [4, 5]  # 192/128: the DeepSeek prefill head dims the card takes for TND
    q, keys, values = batch(q_lens, kv_lens, heads=2, kv_heads=2, dim=192, dtype=torch.bfloat16, value_dim=128)
    out, lse = IMPLEMENTATIONS["npu_fused_infer_attention_score"](
        q, torch.cat(keys), torch.cat(values), num_heads=2, num_key_value_heads=2, input_layout="TND", scale=0.07,
        actual_seq_lengths=cumsum(q_lens), actual_seq_lengths_kv=cumsum(kv_lens), atten_mask=MASK, sparse_mode=3,
        softmax_lse_flag=True)
    expected, expected_lse = reference(q, keys, values, q_lens, scale=0.07)
    assert out.shape == (8, 2, 128)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[..., 0].double(), expected_lse, atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("layout", ["BNSD", "BSND", "BSH", "BNSD_BSND"])
def test_batch_major_layouts_honour_per_batch_lengths(layout):
    b, s, heads, kv_heads, dim = 2, 4, 4, 2, 8
    q_lens, kv_lens = [4, 2], [6, 3]
    g = torch.Generator().manual_seed(7)
    q4 = torch.randn(b, heads, s, dim, generator=g)  # BNSD, padded to S
    k4 = torch.randn(b, kv_heads, 6, dim, generator=g)
    v4 = torch.randn(b, kv_heads, 6, dim, generator=g)
    to_layout = {"BNSD": lambda t: t, "BNSD_BSND": lambda t: t, "BSND": lambda t: t.transpose(1, 2).contiguous(),
                 "BSH": lambda t: t.transpose(1, 2).reshape(t.shape[0], t.shape[2], -1).contiguous()}[layout]
    out, lse = TINY["npu_fused_infer_attention_score"](
        to_layout(q4), to_layout(k4), to_layout(v4), num_heads=heads, num_key_value_heads=kv_heads,
        input_layout=layout, scale=0.3, actual_seq_lengths=q_lens, actual_seq_lengths_kv=kv_lens, atten_mask=MASK,
        sparse_mode=3, softmax_lse_flag=True)
    packed_q = torch.cat([q4[i, :, :q_lens[i]].transpose(0, 1) for i in range(b)])
    keys = [k4[i, :, :kv_lens[i]].transpose(0, 1) for i in range(b)]
    values = [v4[i, :, :kv_lens[i]].transpose(0, 1) for i in range(b)]
    expected, expected_lse = reference(packed_q, keys, values, q_lens, scale=0.3)
    as_bnsd = {"BNSD": lambda t: t, "BSND": lambda t: t.transpose(1, 2), "BNSD_BSND": lambda t: t.transpose(1, 2),
               "BSH": lambda t: t.reshape(b, s, heads, dim).transpose(1, 2)}[layout](out)
    got = torch.cat([as_bnsd[i, :, :q_lens[i]].transpose(0, 1) for i in range(b)])
    assert lse.shape == (b, heads, s, 1)
    torch.testing.assert_close(got.double(), expected, atol=1e-5, rtol=1e-5)
    got_lse = torch.cat([lse[i, :, :q_lens[i], 0].transpose(0, 1) for i in range(b)])
    torch.testing.assert_close(got_lse.double(), expected_lse, atol=1e-5, rtol=1e-5)


def test_full_mask_mode_0_masks_true_positions():
    q, keys, values = batch([3], [5], heads=1, kv_heads=1, dim=8, dtype=torch.float32, seed=9)
    full = torch.zeros(1, 1, 3, 5, dtype=torch.bool)
    full[..., 0] = True  # hide key 0 from every query
    out, _ = TINY["npu_fused_infer_attention_score"](
        q.unsqueeze(0).transpose(1, 2).contiguous(), keys[0].unsqueeze(0).transpose(1, 2).contiguous(),
        values[0].unsqueeze(0).transpose(1, 2).contiguous(), num_heads=1, input_layout="BNSD", scale=0.5,
        atten_mask=full, sparse_mode=0)
    expected, _ = reference(q, [keys[0][1:]], [values[0][1:]], [3], scale=0.5, causal=False)
    torch.testing.assert_close(out[0].transpose(0, 1).double(), expected, atol=1e-5, rtol=1e-5)


# -- MLA: latent attention with the rope split ----------------------------------------------------------------------

@pytest.mark.parametrize("api", ["v1", "v2"])
def test_mla_decode_over_the_paged_latent_cache_with_rope_split(api):
    kv_lens, heads, bs = [5, 130, 1], 8, 128
    g = torch.Generator().manual_seed(11)
    q_nope = torch.randn(3, heads, 512, generator=g).bfloat16()
    q_rope = torch.randn(3, heads, 64, generator=g).bfloat16()
    latents = [torch.randn(n, 1, 512, generator=g).bfloat16() for n in kv_lens]
    ropes = [torch.randn(n, 1, 64, generator=g).bfloat16() for n in kv_lens]
    latent_cache, table = paged(latents, bs)
    rope_cache, _ = paged(ropes, bs)
    common = dict(query_rope=q_rope.view(3, heads, 1, 64), key_rope=rope_cache, num_key_value_heads=1,
                  block_table=table, block_size=bs)
    if api == "v1":
        out, _ = IMPLEMENTATIONS["npu_fused_infer_attention_score"](
            q_nope.view(3, heads, 1, 512), latent_cache, latent_cache, num_heads=heads, input_layout="BNSD",
            scale=0.05, actual_seq_lengths_kv=kv_lens, **common)
        got = out.view(3, heads, 512)
    else:  # vllm-ascend's decode form: BNSD in, NBSD out
        out, _ = IMPLEMENTATIONS["npu_fused_infer_attention_score_v2"](
            q_nope.view(3, heads, 1, 512), latent_cache, latent_cache, num_query_heads=heads,
            input_layout="BNSD_NBSD", softmax_scale=0.05, actual_seq_kvlen=kv_lens, **common)
        assert out.shape == (heads, 3, 1, 512)
        got = out[:, :, 0].transpose(0, 1)
    expected, _ = reference(q_nope, latents, latents, [1, 1, 1], scale=0.05, q_rope=q_rope, k_ropes=ropes)
    torch.testing.assert_close(got.double(), expected, atol=3e-2, rtol=3e-2)


def test_mla_prefill_tnd_with_rope_dim_128():
    q_lens = [3, 4]
    q, keys, values = batch(q_lens, q_lens, heads=2, kv_heads=2, dim=128, dtype=torch.bfloat16, seed=13)
    g = torch.Generator().manual_seed(14)
    q_rope = torch.randn(7, 2, 64, generator=g).bfloat16()
    k_ropes = [torch.randn(n, 2, 64, generator=g).bfloat16() for n in q_lens]
    out, lse = IMPLEMENTATIONS["npu_fused_infer_attention_score"](
        q, torch.cat(keys), torch.cat(values), query_rope=q_rope, key_rope=torch.cat(k_ropes), num_heads=2,
        num_key_value_heads=2, input_layout="TND", scale=0.07, atten_mask=MASK, sparse_mode=3,
        actual_seq_lengths=cumsum(q_lens), actual_seq_lengths_kv=cumsum(q_lens), softmax_lse_flag=True)
    expected, expected_lse = reference(q, keys, values, q_lens, scale=0.07, q_rope=q_rope, k_ropes=k_ropes)
    torch.testing.assert_close(out.double(), expected, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse[..., 0].double(), expected_lse, atol=1e-3, rtol=1e-3)


# -- LSE merge ------------------------------------------------------------------------------------------------------

def test_two_kv_chunks_merged_by_npu_attention_update_equal_full_attention():
    q_lens, kv_lens, bs, dim = [2, 3], [7, 5], 4, 8
    q, keys, values = batch(q_lens, kv_lens, heads=2, kv_heads=1, dim=dim, dtype=torch.float32, seed=17)
    parts = []
    for lo, hi in ((0, 3), (3, None)):  # split every request's keys: [0, 3) and the rest (non-causal)
        ks, vs = [k[lo:hi] for k in keys], [v[lo:hi] for v in values]
        k_cache, table = paged(ks, bs)
        v_cache, _ = paged(vs, bs)
        parts.append(TINY["npu_fused_infer_attention_score"](
            q, k_cache, v_cache, num_heads=2, num_key_value_heads=1, input_layout="TND", scale=0.3,
            block_table=table, block_size=bs, actual_seq_lengths=cumsum(q_lens),
            actual_seq_lengths_kv=[k.shape[0] for k in ks], softmax_lse_flag=True))
    merged, merged_lse = IMPLEMENTATIONS["npu_attention_update"](
        [lse.reshape(-1) for _, lse in parts], [o.reshape(-1, dim) for o, _ in parts], 1)
    expected, expected_lse = reference(q, keys, values, q_lens, scale=0.3, causal=False)
    torch.testing.assert_close(merged.view(5, 2, dim).double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(merged_lse.view(5, 2).double(), expected_lse, atol=1e-5, rtol=1e-5)
    _, unset = IMPLEMENTATIONS["npu_attention_update"]([lse.reshape(-1) for _, lse in parts],
                                                       [o.reshape(-1, dim) for o, _ in parts], 0)
    assert torch.isnan(unset).all()  # update_type 0 leaves lse_out unwritten


def test_attention_update_ignores_a_rank_that_saw_nothing():
    out = [torch.ones(2, 4), torch.full((2, 4), 5.0)]
    merged, lse = IMPLEMENTATIONS["npu_attention_update"](
        [torch.tensor([0.3, float("-inf")]), torch.tensor([float("-inf"), float("-inf")])], out, 1)
    torch.testing.assert_close(merged, torch.tensor([[1.0] * 4, [0.0] * 4]))
    assert lse[0].item() == pytest.approx(0.3) and lse[1].item() == float("-inf")


# -- .out overloads and the ATB cache movers ------------------------------------------------------------------------

def test_out_overload_writes_the_given_tensors():
    q, keys, values = batch([2], [3], heads=2, kv_heads=2, dim=8, dtype=torch.float32)
    k_cache, table = paged(keys, 4)
    v_cache, _ = paged(values, 4)
    args = dict(num_query_heads=2, input_layout="TND", softmax_scale=0.3, block_table=table, block_size=4,
                actual_seq_qlen=[2], actual_seq_kvlen=[3], atten_mask=MASK, sparse_mode=3, return_softmax_lse=True)
    expected_out, expected_lse = TINY["npu_fused_infer_attention_score_v2"](q, k_cache, v_cache, **args)
    out, lse = torch.empty(2, 2, 8), torch.empty(2, 2, 1)
    returned = TINY["npu_fused_infer_attention_score_v2.out"](q, k_cache, v_cache, **args, out=[out, lse])
    assert returned[0] is out and returned[1] is lse
    torch.testing.assert_close(out, expected_out)
    torch.testing.assert_close(lse, expected_lse)


def test_reshape_and_cache_scatters_by_slot_and_paged_cache_load_reads_back():
    g = torch.Generator().manual_seed(19)
    key, value = torch.randn(5, 1, 32, generator=g).half(), torch.randn(5, 1, 16, generator=g).half()
    key_cache, value_cache = torch.zeros(4, 4, 1, 32).half(), torch.zeros(4, 4, 1, 16).half()
    slots = torch.tensor([13, 14, 15, 4, 5], dtype=torch.int32)  # request 0: blocks 3, 1; request 1 at block 1
    assert IMPLEMENTATIONS["_npu_reshape_and_cache"](key, value, key_cache, value_cache, slots) is None
    for t, slot in enumerate(slots.tolist()):
        assert torch.equal(key_cache[slot // 4, slot % 4], key[t]) and torch.equal(value_cache[slot // 4, slot % 4],
                                                                                   value[t])
    table = torch.tensor([[3, 1], [1, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 1], dtype=torch.int32)
    out_k, out_v = IMPLEMENTATIONS["npu_paged_cache_load"](key_cache, value_cache, table, lens,
                                                           seq_starts=torch.tensor([0, 1], dtype=torch.int32))
    assert torch.equal(out_k[:5], torch.cat([key_cache[3], key_cache[1, :1]]))
    assert torch.equal(out_k[5], key_cache[1, 1]) and torch.equal(out_v[5], value_cache[1, 1])
    into_k, into_v = torch.empty(6, 1, 32).half(), torch.empty(6, 1, 16).half()
    got = IMPLEMENTATIONS["npu_paged_cache_load"](key_cache, value_cache, table,
                                                  torch.tensor([0, 5, 6], dtype=torch.int32), cumsum=True,
                                                  seq_starts=torch.tensor([0, 1], dtype=torch.int32), key=into_k,
                                                  value=into_v)
    assert got[0] is into_k and torch.equal(into_k, out_k) and torch.equal(into_v, out_v)


# -- refusals -------------------------------------------------------------------------------------------------------

def _paged_call(**overrides):
    """A valid card-profile v2 TND paged call; each refusal test breaks one thing."""
    q, keys, values = batch([2, 1], [5, 3], heads=2, kv_heads=1, dim=16, dtype=torch.bfloat16)
    k_cache, table = paged(keys, 128)
    v_cache, _ = paged(values, 128)
    args = dict(query=q, key=k_cache, value=v_cache, num_query_heads=2, num_key_value_heads=1, input_layout="TND",
                softmax_scale=0.25, block_table=table, block_size=128, actual_seq_qlen=[2, 3],
                actual_seq_kvlen=[5, 3], atten_mask=MASK, sparse_mode=3)
    args.update(overrides)
    return args


def _strided_plane(cache):
    """A K plane of a [blocks, 2, block_size, H] backing: each block strides over the V plane."""
    backing = torch.zeros(cache.shape[0], 2, *cache.shape[1:], dtype=cache.dtype)
    return backing[:, 0]


def test_the_valid_paged_call_is_accepted():
    out, _ = IMPLEMENTATIONS["npu_fused_infer_attention_score_v2"](**_paged_call())
    assert out.shape == (3, 2, 16)


REFUSALS = {
    "non-contiguous cache": (lambda a: dict(key=_strided_plane(a["key"])), "key must be contiguous"),
    "causal without mask": (lambda a: dict(atten_mask=None), "needs the compressed 2048x2048 atten_mask, got None"),
    "mask of wrong size": (lambda a: dict(atten_mask=MASK[:1024, :1024].contiguous()), "got shape (1024, 1024)"),
    "mask not triangular": (lambda a: dict(atten_mask=MASK.logical_not()), "triu(ones(2048, 2048), diagonal=1)"),
    "mask float": (lambda a: dict(atten_mask=MASK.float()), "atten_mask dtype"),
    "sparse_mode 5": (lambda a: dict(sparse_mode=5), "sparse_mode=5 is not implemented"),
    "sparse_mode 7": (lambda a: dict(sparse_mode=7), "sparse_mode=7"),
    "TND allMask": (lambda a: dict(sparse_mode=1), "TND/NTD take sparse_mode 0 without atten_mask, 3 or 4"),
    "TND mode 0 with mask": (lambda a: dict(sparse_mode=0), "TND/NTD take sparse_mode 0 without atten_mask"),
    "band empty": (lambda a: dict(sparse_mode=4, pre_tokens=-3, next_tokens=1), "pre_tokens + next_tokens >= 0"),
    "q lengths not ending at T": (lambda a: dict(actual_seq_qlen=[2, 2]), "actual_seq_qlen[-1] must equal"),
    "q lengths decreasing": (lambda a: dict(actual_seq_qlen=[3, 2]), "non-decreasing"),
    "q lengths missing": (lambda a: dict(actual_seq_qlen=None), "actual_seq_qlen is required"),
    "kv lengths missing": (lambda a: dict(actual_seq_kvlen=None), "actual_seq_kvlen is required"),
    "kv lengths count": (lambda a: dict(actual_seq_kvlen=[5]), "has 1 elements, batch is 2"),
    "kv beyond table": (lambda a: dict(actual_seq_kvlen=[5, 129]), "must be within [0, 128]"),
    "table int64": (lambda a: dict(block_table=a["block_table"].long()), "block_table dtype"),
    "table rows": (lambda a: dict(block_table=a["block_table"][:1]), "block_table has 1 rows"),
    "table ids": (lambda a: dict(block_table=a["block_table"] + 100), "points outside"),
    "block_size mismatch": (lambda a: dict(block_size=256), "block_size=256 but the cache"),
    "k/v shapes": (lambda a: dict(value=a["value"][:, :, :8].contiguous()), "key and value of one shape"),
    "4-D cache with BSND": (lambda a: dict(query=a["query"].unsqueeze(1).contiguous(), input_layout="BSND",
                                           key=a["key"].view(-1, 128, 1, 16).contiguous(),
                                           value=a["value"].view(-1, 128, 1, 16).contiguous()),
                            "needs a BNSD or TND query"),
    "gqa divisibility": (lambda a: dict(num_key_value_heads=3), "must be a multiple of num_key_value_heads=3"),
    "query heads": (lambda a: dict(num_query_heads=4), "query has 2 heads"),
    "rope alone": (lambda a: dict(query_rope=torch.zeros(3, 2, 64).bfloat16()), "must be given together"),
    "sink on BNSD": (lambda a: dict(learnable_sink=torch.zeros(2).bfloat16(), input_layout="BNSD",
                                    query=a["query"][:2].view(1, 2, 2, 16).contiguous(),
                                    block_table=a["block_table"][:1], actual_seq_kvlen=[5]),
                     "learnable_sink needs input_layout TND"),
    "sink shape": (lambda a: dict(learnable_sink=torch.zeros(3).bfloat16()), "learnable_sink must have shape (2,)"),
    "card dtype": (lambda a: dict(query=a["query"].float(), key=a["key"].float(), value=a["value"].float()),
                   "query dtype must be one of"),
    "k dtype": (lambda a: dict(key=a["key"].half()), "key dtype torch.float16 must equal query dtype"),
    "prompt block size": (lambda a: dict(key=a["key"].view(-1, 64, 16), value=a["value"].view(-1, 64, 16),
                                         block_size=64,
                                         block_table=torch.tensor([[0], [1]], dtype=torch.int32)),
                          "multiple of 128"),
    "inner_precise": (lambda a: dict(inner_precise=4), "inner_precise must be"),
    "layout": (lambda a: dict(input_layout="SBH"), "input_layout must be one of"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_fia_refuses(case):
    breaking, message = REFUSALS[case]
    args = _paged_call()
    args.update(breaking(args))
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPLEMENTATIONS["npu_fused_infer_attention_score_v2"](**args)


def test_tnd_mode_3_refuses_more_queries_than_keys():
    q, keys, values = batch([3], [2], heads=1, kv_heads=1, dim=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="batch 0 has 3 queries over 2 keys"):
        TINY["npu_fused_infer_attention_score"](q, torch.cat(keys), torch.cat(values), num_heads=1,
                                                input_layout="TND", actual_seq_lengths=[3], actual_seq_lengths_kv=[2],
                                                atten_mask=MASK, sparse_mode=3)


@pytest.mark.parametrize("case", ["fp16", "head dims"])
def test_unpaged_tnd_card_limits(case):
    dtype, dim = (torch.float16, 128) if case == "fp16" else (torch.bfloat16, 64)
    q, keys, values = batch([2], [2], heads=1, kv_heads=1, dim=dim, dtype=dtype)
    message = "take bfloat16 only" if case == "fp16" else "(query/key D, value D)"
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPLEMENTATIONS["npu_fused_infer_attention_score"](q, keys[0], values[0], num_heads=1, input_layout="TND",
                                                           actual_seq_lengths=[2], actual_seq_lengths_kv=[2])


def test_mla_latent_needs_page_attention_and_rope_dim_64():
    q = torch.zeros(1, 8, 1, 512).bfloat16()
    latent = torch.zeros(1, 1, 4, 512).bfloat16()
    with pytest.raises(ValueError, match="needs page attention"):
        IMPLEMENTATIONS["npu_fused_infer_attention_score"](
            q, latent, latent, query_rope=torch.zeros(1, 8, 1, 64).bfloat16(),
            key_rope=torch.zeros(1, 1, 4, 64).bfloat16(), num_heads=8, num_key_value_heads=1, input_layout="BNSD")
    with pytest.raises(ValueError, match="must have D=64, got 32"):
        IMPLEMENTATIONS["npu_fused_infer_attention_score"](
            q, latent, latent, query_rope=torch.zeros(1, 8, 1, 32).bfloat16(),
            key_rope=torch.zeros(1, 1, 4, 32).bfloat16(), num_heads=8, num_key_value_heads=1, input_layout="BNSD")


def test_unmodelled_arguments_are_not_silently_ignored():
    with pytest.raises(NotImplementedError, match="pse_shift"):
        IMPLEMENTATIONS["npu_fused_infer_attention_score_v2"](**_paged_call(pse_shift=torch.zeros(1)))
    with pytest.raises(NotImplementedError, match="antiquant_mode"):
        IMPLEMENTATIONS["npu_fused_infer_attention_score"](torch.zeros(1, 1, 16), torch.zeros(1, 1, 16),
                                                           torch.zeros(1, 1, 16), antiquant_mode=1)


CACHE_REFUSALS = {
    "slot int64": (dict(slot_indices=torch.tensor([0, 1])), "slot_indices dtype"),
    "pad slot": (dict(slot_indices=torch.tensor([0, -1], dtype=torch.int32)), "slot_indices must lie in [0, 16)"),
    "slot past cache": (dict(slot_indices=torch.tensor([0, 16], dtype=torch.int32)), "must lie in [0, 16)"),
    "strided cache": (dict(key_cache=torch.zeros(4, 2, 4, 1, 8).half()[:, 0]), "key_cache must be contiguous"),
    "dtype mix": (dict(value=torch.zeros(2, 1, 8).bfloat16()), "must share one dtype"),
    "head size": (dict(key=torch.zeros(2, 1, 4).half()), "must be [tokens, heads, head_size]"),
}


@pytest.mark.parametrize("case", sorted(CACHE_REFUSALS))
def test_reshape_and_cache_refuses(case):
    args = dict(key=torch.zeros(2, 1, 8).half(), value=torch.zeros(2, 1, 8).half(),
                key_cache=torch.zeros(4, 4, 1, 8).half(), value_cache=torch.zeros(4, 4, 1, 8).half(),
                slot_indices=torch.tensor([0, 1], dtype=torch.int32))
    overrides, message = CACHE_REFUSALS[case]
    args.update(overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPLEMENTATIONS["_npu_reshape_and_cache"](**args)


LOAD_REFUSALS = {
    "cumsum length": (dict(context_lens=torch.tensor([2, 1], dtype=torch.int32), cumsum=True), "batch+1 = 2"),
    "lens count": (dict(context_lens=torch.tensor([2, 1], dtype=torch.int32)), "one length per block_table row"),
    "out shape": (dict(key=torch.empty(3, 1, 16).half()), "key must be (2, 1, 16)"),
    "alignment": (dict(value_cache=torch.zeros(4, 4, 1, 8).half()), "32-byte aligned"),
    "past the row": (dict(seq_starts=torch.tensor([7], dtype=torch.int32)), "beyond its block_table row"),
    "table dtype": (dict(block_table=torch.tensor([[0, 1]])), "block_table dtype"),
}


@pytest.mark.parametrize("case", sorted(LOAD_REFUSALS))
def test_paged_cache_load_refuses(case):
    args = dict(key_cache=torch.zeros(4, 4, 1, 16).half(), value_cache=torch.zeros(4, 4, 1, 16).half(),
                block_table=torch.tensor([[0, 1]], dtype=torch.int32),
                context_lens=torch.tensor([2], dtype=torch.int32))
    overrides, message = LOAD_REFUSALS[case]
    args.update(overrides)
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPLEMENTATIONS["npu_paged_cache_load"](**args)


@pytest.mark.parametrize("lse, out, update_type, message", [
    ([torch.zeros(2).half()], [torch.zeros(2, 4)], 0, "lse[0] must be float32"),
    ([torch.zeros(2)], [torch.zeros(2, 4)], 2, "update_type must be 0"),
    ([torch.zeros(2), torch.zeros(3)], [torch.zeros(2, 4)] * 2, 0, "lse[1] must be [batch*seq*heads] = (2,)"),
    ([torch.zeros(2)] * 2, [torch.zeros(2, 4), torch.zeros(2, 4).half()], 0, "local_out[1] dtype"),
    ([torch.zeros(2)], [], 0, "non-empty lists of one length"),
])
def test_attention_update_refuses(lse, out, update_type, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        IMPLEMENTATIONS["npu_attention_update"](lse, out, update_type)


# -- the schema: names, keyword-only-ness and defaults as torch_npu 2.13 declares them ------------------------------

def _wheel_schemas() -> dict:
    """The FIA schemas as the torch_npu 2.13.0 wheel declares them (fetched into the wheel cache once)."""
    from ascend_contracts.torch_npu_wheel import open_torch_npu_wheel

    schemas = open_torch_npu_wheel("2.13.0").schemas
    return {name: torch._C.parse_schema(text) for name, text in schemas.items()
            if name.startswith("npu_fused_infer_attention_score")}


@pytest.mark.parametrize("name", ["npu_fused_infer_attention_score", "npu_fused_infer_attention_score.out",
                                  "npu_fused_infer_attention_score_v2", "npu_fused_infer_attention_score_v2.out"])
def test_fia_parameters_are_the_wheel_schema(name):
    schema = _wheel_schemas()[name]
    params = inspect.signature(IMPLEMENTATIONS[name]).parameters
    assert list(params) == [a.name for a in schema.arguments]
    for argument in schema.arguments:
        param = params[argument.name]
        assert (param.kind is inspect.Parameter.KEYWORD_ONLY) == argument.kwarg_only, argument.name
        if argument.default_value is not None or param.default is not inspect.Parameter.empty:
            assert param.default == argument.default_value, argument.name


def test_profiles_differ_only_in_size_lists():
    assert CARD.attention_dtypes != TINY_MODELS.attention_dtypes and CARD.max_gqa_ratio == TINY_MODELS.max_gqa_ratio
