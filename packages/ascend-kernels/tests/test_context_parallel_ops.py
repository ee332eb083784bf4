"""The context-parallel ops against naive formulations in float64: attention with its log-sum-exp (contiguous and
paged), the log-sum-exp merge, and the selection of rows from an all-gathered K|V.

The property PCP relies on is checked directly: a chunk's attention over its cached context (paged, non-causal)
merged with its attention over this step's keys (causal, bottom-right) equals causal attention over everything.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

F64 = torch.float64


def naive(q, k, v, qs, ks, scale, causal):
    """Per row and query: the visible keys' softmax, with the log-sum-exp, in float64."""
    t, h, _ = q.shape
    group = h // k.shape[1]
    out = torch.zeros(t, h, v.shape[2], dtype=F64)
    lse = torch.full((t, h), float("-inf"), dtype=F64)
    for r in range(len(qs) - 1):
        m, n = qs[r + 1] - qs[r], ks[r + 1] - ks[r]
        for i in range(m):
            visible = [j for j in range(n) if not causal or j <= n - m + i]
            if not visible:
                continue
            for head in range(h):
                keys = k[ks[r]:ks[r + 1], head // group].double()[visible]
                vals = v[ks[r]:ks[r + 1], head // group].double()[visible]
                logits = scale * keys @ q[qs[r] + i, head].double()
                lse[qs[r] + i, head] = torch.logsumexp(logits, 0)
                out[qs[r] + i, head] = torch.softmax(logits, 0) @ vals
    return out, lse


def _starts(lens):
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def _rows(q_lens, kv_lens, heads, kv_heads, dtype=F64, head=16, head_v=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, head, generator=g).to(dtype)
    k = torch.randn(sum(kv_lens), kv_heads, head, generator=g).to(dtype)
    v = torch.randn(sum(kv_lens), kv_heads, head_v or head, generator=g).to(dtype)
    return q, k, v, _starts(q_lens), _starts(kv_lens)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(("heads", "kv_heads"), [(2, 2), (4, 2), (4, 1)])
def test_attention_with_lse_matches_naive(causal, heads, kv_heads):
    # A chunk continuing a context (3 of 9), a whole prefill (5 of 5), a decode (1 of 7), a row with no query.
    q_lens, kv_lens = [3, 5, 1, 0], [9, 5, 7, 4]
    q, k, v, qs, ks = _rows(q_lens, kv_lens, heads, kv_heads, head_v=24)
    out, lse = ops.attention_with_lse(q, k, v, qs, ks, scale=0.3, causal=causal)
    ref_out, ref_lse = naive(q, k, v, qs.tolist(), ks.tolist(), 0.3, causal)
    assert out.dtype == F64 and lse.dtype == F64 and out.shape == (9, heads, 24)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_rows_without_keys_and_padding_rows_are_zero_with_lse_minus_inf():
    q, k, v, qs, ks = _rows([2, 2], [0, 3], 2, 2)
    q = torch.cat([q, torch.ones(3, 2, 16, dtype=F64)])  # three padding rows past the last query
    out = torch.full((7, 2, 16), 7.0, dtype=F64)
    got, lse = ops.attention_with_lse(q, k, v, qs, ks, scale=1.0, out=out)
    assert got is out
    assert out[:2].eq(0).all() and torch.isinf(lse[:2]).all() and (lse[:2] < 0).all()
    assert out[4:].eq(0).all() and torch.isinf(lse[4:]).all()
    assert torch.isfinite(lse[2:4]).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lower_precisions_stay_close_to_float64(dtype):
    q, k, v, qs, ks = _rows([40, 1], [100, 17], 4, 2, dtype=dtype, seed=3)
    out, lse = ops.attention_with_lse(q, k, v, qs, ks, scale=0.25)
    ref_out, ref_lse = naive(q, k, v, qs.tolist(), ks.tolist(), 0.25, True)
    assert out.dtype == dtype and lse.dtype == torch.float32
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=tol, atol=tol)


def _paged(contexts, heads=2, kv_heads=2, head=16, block_size=16, seed=1):
    """Paged K/V caches holding `contexts[r]` tokens for row r in scattered blocks, plus those keys contiguous."""
    g = torch.Generator().manual_seed(seed)
    nbk = [-(-n // block_size) for n in contexts]
    num_blocks = sum(nbk) + 2
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head, generator=g, dtype=F64)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head, generator=g, dtype=F64)
    perm = torch.randperm(num_blocks, generator=g)
    table = torch.zeros(len(contexts), max(nbk + [1]), dtype=torch.int32)
    keys, vals, used = [], [], 0
    for r, n in enumerate(contexts):
        blocks = perm[used:used + nbk[r]]
        used += nbk[r]
        table[r, :nbk[r]] = blocks.to(torch.int32)
        pos = torch.arange(n)
        keys.append(key_cache[blocks[pos // block_size], pos % block_size])
        vals.append(value_cache[blocks[pos // block_size], pos % block_size])
    return key_cache, value_cache, table, torch.cat(keys), torch.cat(vals)


@pytest.mark.parametrize("causal", [False, True])
def test_paged_attention_with_lse_reads_the_same_keys_as_contiguous_rows(causal):
    contexts = [33, 16, 0, 50]  # across block edges, exactly one block, nothing cached, many blocks
    q_lens = [4, 1, 2, 7]
    key_cache, value_cache, table, keys, vals = _paged(contexts)
    g = torch.Generator().manual_seed(9)
    q = torch.randn(sum(q_lens), 2, 16, generator=g, dtype=F64)
    qs, seq = _starts(q_lens), torch.tensor(contexts, dtype=torch.int32)
    out, lse = ops.paged_attention_with_lse(q, key_cache, value_cache, table, qs, seq, scale=0.2, causal=causal)
    ref_out, ref_lse = naive(q, keys, vals, qs.tolist(), _starts(contexts).tolist(), 0.2, causal)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    rows_without_context = slice(int(qs[2]), int(qs[3]))
    assert out[rows_without_context].eq(0).all() and torch.isinf(lse[rows_without_context]).all()


@pytest.mark.parametrize("shards", [2, 3, 4])
def test_merging_shards_by_lse_equals_attention_over_all_keys(shards):
    # One 29-token prefill; its keys dealt to `shards` parts round-robin, as PCP deals chunks to ranks.
    n, heads = 29, 4
    q, k, v, _, _ = _rows([n], [n], heads, 2, seed=shards)
    qs = _starts([n])
    owner = torch.arange(n) % shards
    outs, lses = [], []
    for s in range(shards):
        idx = (owner == s).nonzero().flatten()
        # Part s: every query over the keys of shard s that precede it, naive (the property under test is merge's).
        part_out = torch.zeros(n, heads, 16, dtype=F64)
        part_lse = torch.full((n, heads), float("-inf"), dtype=F64)
        for i in range(n):
            vis = idx[idx <= i]
            if vis.numel():
                o, lse = naive(q[i:i + 1], k[vis], v[vis], [0, 1], [0, vis.numel()], 0.5, False)
                part_out[i], part_lse[i] = o[0], lse[0]
        outs.append(part_out)
        lses.append(part_lse)
    merged, merged_lse = ops.merge_attention_states(outs, lses)
    ref_out, ref_lse = naive(q, k, v, qs.tolist(), qs.tolist(), 0.5, True)
    torch.testing.assert_close(merged, ref_out, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(merged_lse, ref_lse, rtol=1e-12, atol=1e-12)


def test_context_part_merged_with_step_part_equals_causal_attention_over_everything():
    """What a PCP chunk computes: cached context (paged, non-causal) + this step's keys (bottom-right causal)."""
    contexts = [40, 0, 17]  # chunked prefill with context, a fresh prefill, a prefix-cache hit
    step = [24, 9, 5]  # this step's keys of each request
    q_lens = [6, 9, 2]  # the chunk each row holds: the last q_len of the step's keys
    heads, kv_heads = 4, 2
    key_cache, value_cache, table, ctx_k, ctx_v = _paged(contexts, heads, kv_heads)
    g = torch.Generator().manual_seed(5)
    step_k = torch.randn(sum(step), kv_heads, 16, generator=g, dtype=F64)
    step_v = torch.randn(sum(step), kv_heads, 16, generator=g, dtype=F64)
    q = torch.randn(sum(q_lens), heads, 16, generator=g, dtype=F64)
    qs = _starts(q_lens)
    ctx_out, ctx_lse = ops.paged_attention_with_lse(q, key_cache, value_cache, table, qs,
                                                    torch.tensor(contexts, dtype=torch.int32), scale=0.3,
                                                    causal=False)
    new_out, new_lse = ops.attention_with_lse(q, step_k, step_v, qs, _starts(step), scale=0.3)
    out, _ = ops.merge_attention_states([ctx_out, new_out], [ctx_lse, new_lse])
    # Reference: each request's whole key sequence (context then step), causal from the bottom right.
    cs, ss = _starts(contexts).tolist(), _starts(step).tolist()
    all_k = torch.cat([torch.cat([ctx_k[cs[r]:cs[r + 1]], step_k[ss[r]:ss[r + 1]]]) for r in range(3)])
    all_v = torch.cat([torch.cat([ctx_v[cs[r]:cs[r + 1]], step_v[ss[r]:ss[r + 1]]]) for r in range(3)])
    totals = _starts([c + s for c, s in zip(contexts, step, strict=True)]).tolist()
    ref, _ = naive(q, all_k, all_v, qs.tolist(), totals, 0.3, True)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_merge_writes_into_out_and_keeps_rows_no_part_saw_at_zero():
    o = torch.randn(3, 2, 8, dtype=F64)
    nothing = torch.full((3, 2), float("-inf"), dtype=F64)
    lse = torch.zeros(3, 2, dtype=F64)
    lse[1] = float("-inf")
    out = torch.empty(3, 2, 8, dtype=F64)
    merged, total = ops.merge_attention_states([o, torch.zeros_like(o)], [lse, nothing], out=out)
    assert merged is out
    torch.testing.assert_close(out[0], o[0])
    assert out[1].eq(0).all() and torch.isinf(total[1]).all()


def test_gather_kv_rows_selects_and_splits_the_packed_gather():
    packed = torch.arange(6 * 2 * 5, dtype=F64).view(6, 2, 5)  # keys of size 3, values of size 2
    keys, values = ops.gather_kv_rows(packed, torch.tensor([4, 0, 4]), key_size=3)
    torch.testing.assert_close(keys, packed[[4, 0, 4], :, :3])
    torch.testing.assert_close(values, packed[[4, 0, 4], :, 3:])


@pytest.mark.parametrize(("call", "message"), [
    (lambda: ops.attention_with_lse(torch.zeros(2, 3, 8), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8),
                                    torch.tensor([0, 2]), torch.tensor([0, 2]), scale=1.0), "argument 'k'"),
    (lambda: ops.attention_with_lse(torch.zeros(2, 2, 8), torch.zeros(2, 2, 8), torch.zeros(2, 2, 8),
                                    torch.tensor([0, 1, 2]), torch.tensor([0, 2]), scale=1.0),
     "argument 'kv_start_loc'"),
    (lambda: ops.merge_attention_states([torch.zeros(2, 2, 4)], [torch.zeros(2, 3)]), r"argument 'lses\[0\]'"),
    (lambda: ops.merge_attention_states([torch.zeros(2, 2, 4)], []), "argument 'lses'"),
    (lambda: ops.gather_kv_rows(torch.zeros(4, 2, 6), torch.tensor([1]), key_size=6), "argument 'key_size'"),
])
def test_bad_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(("dtype", "tol"), [(torch.float32, 2e-5), (torch.bfloat16, 3e-2)])
@pytest.mark.parametrize("causal", [False, True])
def test_paged_attention_with_lse_on_the_native_loop_matches_float64(native_loops, dtype, tol, causal):
    """Float32 / bf16 host tensors take the reference's tiled native loop (each row's log-sum-exp from its online
    softmax): held to the naive float64 attention; a batch where a request has fewer cached keys than queries keeps
    the torch formulation (the loop takes no such call), with the same result."""
    from ascend_kernels.reference import native_build

    contexts, q_lens = [33, 16, 70, 5], [4, 1, 7, 5]  # across block edges, one block, many blocks, all its keys
    key_cache, value_cache, table, keys, vals = _paged(contexts, heads=4, kv_heads=2)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(sum(q_lens), 4, 16, generator=g, dtype=F64)
    qs, seq = _starts(q_lens), torch.tensor(contexts, dtype=torch.int32)
    ref_out, ref_lse = naive(q.to(dtype), keys.to(dtype), vals.to(dtype), qs.tolist(), _starts(contexts).tolist(),
                             0.2, causal)
    before = native_build.calls_of("paged_attention")
    out, lse = ops.paged_attention_with_lse(q.to(dtype), key_cache.to(dtype), value_cache.to(dtype), table, qs, seq,
                                            scale=0.2, causal=causal)
    assert native_build.calls_of("paged_attention") == before + 1
    assert out.dtype == dtype and lse.dtype == torch.float32
    torch.testing.assert_close(out.double(), ref_out, rtol=tol, atol=tol)
    torch.testing.assert_close(lse.double(), ref_lse, rtol=tol, atol=tol)
    short = torch.tensor([33, 16, 0, 5], dtype=torch.int32)  # request 2: no cached keys for its 7 queries
    out2, lse2 = ops.paged_attention_with_lse(q.to(dtype), key_cache.to(dtype), value_cache.to(dtype), table, qs,
                                              short, scale=0.2, causal=causal)
    assert native_build.calls_of("paged_attention") == before + 1
    assert out2[int(qs[2]):int(qs[3])].eq(0).all() and torch.isinf(lse2[int(qs[2]):int(qs[3])]).all()
    torch.testing.assert_close(out2[: int(qs[2])], out[: int(qs[2])], rtol=tol, atol=tol)


def test_the_tiled_loop_refuses_an_lse_it_would_write_past(native_loops):
    from ascend_kernels.reference import native_attention

    contexts = [20, 9]  # 3 and 2 queries: starts [0, 3, 5]
    key_cache, value_cache, table, _, _ = _paged(contexts, heads=4, kv_heads=2)
    q = torch.randn(5, 4, 16)
    out = torch.zeros(5, 4, 16)
    args = (q, key_cache.float(), value_cache.float(), table, [0, 3, 5], contexts, 0.2, False, None, None, out)
    for bad in (torch.zeros(5, 2), torch.zeros(4, 4), torch.zeros(20), torch.zeros(5, 4, dtype=torch.float64)):
        assert not native_attention.paged_tiled(*args, bad)
    good = torch.full((5, 4), float("-inf"))
    assert native_attention.paged_tiled(*args, good) and torch.isfinite(good).all()
