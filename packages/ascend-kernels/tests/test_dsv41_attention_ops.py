"""DeepSeek V4.1's plain-row attention path: the query RoPE + sliding-window insert into a model-dtype cache
(`dsv41_q_rope_kv_insert`), V4's sparse MLA reading such plain-row caches, V4's fp8_ds_mla insert without the query
norm (`apply_q_norm=False`), and the final stream collapse (`dsv41_hc_collapse`), against float64 loops."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops

H, D, ROPE = 2, 512, 64


def _naive_rope_row(x, p, rope_cache, dsv4_naive):
    c, s = rope_cache[p, :ROPE // 2].double(), rope_cache[p, ROPE // 2:].double()
    x = x.double()
    return torch.cat((x[:-ROPE], dsv4_naive.gptj(x[-ROPE:], c, s)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("flat_view", [False, True])
def test_q_rope_kv_insert_rotates_q_and_stores_plain_rows(dtype, flat_view, dsv4_naive):
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(4, H, D, generator=gen).to(dtype)
    kv = torch.randn(4, D, generator=gen).to(dtype)
    pos = torch.tensor([3, 4, 5, 9])
    slots = torch.tensor([2, -1, 5])  # 3 rows inserted, the 4th token only rotates its query
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    cache = torch.full((2, 4, D), 7.0, dtype=dtype)
    target = cache.view(2, -1) if flat_view else cache
    q_out = ops.dsv41_q_rope_kv_insert(q, kv, pos, target, slots, rope_cache, 4)
    assert q_out.shape == q.shape and q_out.dtype == dtype
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    for t in range(4):
        for h in range(H):
            want = _naive_rope_row(q[t, h], int(pos[t]), rope_cache, dsv4_naive)
            torch.testing.assert_close(q_out[t, h].double(), want, rtol=tol, atol=tol)
    for t, s in ((0, 2), (2, 5)):
        want = _naive_rope_row(kv[t], int(pos[t]), rope_cache, dsv4_naive)
        torch.testing.assert_close(cache[s // 4, s % 4].double(), want, rtol=tol, atol=tol)
    untouched = [s for s in range(8) if s not in (2, 5)]
    assert all(torch.all(cache[s // 4, s % 4] == 7.0) for s in untouched)
    assert torch.equal(q_out[:, :, :-ROPE], q[:, :, :-ROPE])  # no query norm in V4.1


def test_qnorm_rope_kv_insert_without_the_query_norm(dsv4_naive):
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(3, H, D, generator=gen) * 3
    kv = torch.randn(3, D, generator=gen)
    pos, slots = torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])
    rope_cache = dsv4_naive.rope_cache(8, ROPE)
    args = (kv, pos, torch.zeros(1, 4 * 584, dtype=torch.uint8), slots, rope_cache, H + 2, 1e-6, 4)
    plain = ops.dsv4_qnorm_rope_kv_insert(q, *args, apply_q_norm=False)
    normed = ops.dsv4_qnorm_rope_kv_insert(q, *args)
    for t in range(3):
        for h in range(H):
            want = _naive_rope_row(q[t, h], int(pos[t]), rope_cache, dsv4_naive)
            torch.testing.assert_close(plain[t, h].double(), want, rtol=1e-5, atol=1e-5)
            rms = math.sqrt(float(q[t, h].double().square().mean()) + 1e-6)
            torch.testing.assert_close(normed[t, h].double(), want / rms, rtol=1e-5, atol=1e-5)
    assert torch.all(plain[:, H:] == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_mla_reads_plain_row_caches(dtype):
    gen = torch.Generator().manual_seed(2)
    t, bs, cbs = 3, 4, 2
    window = torch.randn(3, bs, D, generator=gen).to(dtype)
    compressed = torch.randn(4, cbs, D, generator=gen).to(dtype)
    q = torch.randn(t, H, D, generator=gen) * 0.05
    window_slots = torch.tensor([[0, 5, -1], [7, 11, 3], [-1, -1, -1]])
    compressed_slots = torch.tensor([[1, 6], [-1, 2], [99, -1]])  # 99: past the cache, not counted
    sink = torch.randn(H, generator=gen)
    out = torch.empty(t, H, D)
    ops.dsv4_sparse_mla_with_kvcache(out, q, window.view(3, -1), window_slots, bs, compressed.view(4, -1),
                                     compressed_slots, cbs, sink, 0.7)
    for i in range(t):
        keys = [window[s // bs, s % bs] for s in window_slots[i].tolist() if 0 <= s < 12]
        keys += [compressed[s // cbs, s % cbs] for s in compressed_slots[i].tolist() if 0 <= s < 8]
        if not keys:
            assert torch.all(out[i] == 0)
            continue
        k = torch.stack(keys).double()
        for h in range(H):
            logits = (k @ q[i, h].double()) * 0.7
            w = torch.exp(logits) / (torch.exp(logits).sum() + math.exp(float(sink[h])))
            torch.testing.assert_close(out[i, h].double(), w @ k, rtol=1e-4, atol=1e-5)


def test_insert_then_attend_over_a_model_dtype_cache(dsv4_naive):
    """The two ops as the V4.1 layer chains them: a single-key window attends to exactly its own roped row."""
    gen = torch.Generator().manual_seed(3)
    q, kv = torch.randn(2, H, D, generator=gen), torch.randn(2, D, generator=gen)
    rope_cache = dsv4_naive.rope_cache(8, ROPE)
    cache = torch.zeros(1, 4, D)
    q_roped = ops.dsv41_q_rope_kv_insert(q, kv, torch.tensor([1, 2]), cache, torch.tensor([1, 2]), rope_cache, 4)
    out = torch.empty(2, H, D)
    ops.dsv4_sparse_mla_with_kvcache(out, q_roped, cache.view(1, -1), torch.tensor([[1], [2]]), 4,
                                     cache.view(1, -1), torch.empty(2, 0, dtype=torch.long), 4,
                                     torch.full((H,), -1e4), 0.1)
    for t in range(2):
        torch.testing.assert_close(out[t], cache[0, t + 1].expand(H, D), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_hc_collapse_matches_naive(dtype):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, 2, 8, generator=gen).to(dtype)
    pre = torch.rand(3, 2, generator=gen)
    got = ops.dsv41_hc_collapse(x, pre)
    assert got.dtype == dtype and got.shape == (3, 8)
    want = torch.stack([sum(pre[t, j].double() * x[t, j].double() for j in range(2)) for t in range(3)])
    tol = {torch.float32: 1e-6, torch.float64: 1e-12, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_attention_validation_names_the_argument(dsv4_naive):
    rope_cache = dsv4_naive.rope_cache(8, ROPE)
    with pytest.raises(ValueError, match="dsv41_q_rope_kv_insert: argument 'swa_kv_cache'"):
        ops.dsv41_q_rope_kv_insert(torch.zeros(1, H, D), torch.zeros(1, D), torch.zeros(1, dtype=torch.long),
                                   torch.zeros(1, 4, D - 1), torch.zeros(1, dtype=torch.long), rope_cache, 4)
    with pytest.raises(ValueError, match="dsv4_sparse_mla_with_kvcache: argument 'window_cache_2d'"):
        ops.dsv4_sparse_mla_with_kvcache(torch.zeros(1, H, D), torch.zeros(1, H, D), torch.zeros(1, 3 * D),
                                         torch.zeros(1, 1, dtype=torch.long), 4, torch.zeros(1, 4 * D),
                                         torch.zeros(1, 0, dtype=torch.long), 4, torch.zeros(H), 0.1)
    with pytest.raises(ValueError, match="dsv41_hc_collapse: argument 'pre_mix'"):
        ops.dsv41_hc_collapse(torch.zeros(2, 2, 4), torch.zeros(2, 3))
