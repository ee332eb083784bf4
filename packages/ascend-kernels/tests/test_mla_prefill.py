"""gather_mla_cache and mla_prefill_attention against naive per-token formulations in float64."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops


def _cache(gen, nb, bs, rank, rope_dim, dtype):
    backing = torch.randn(nb, bs, rank + rope_dim, generator=gen).to(dtype)  # one packed latent|rope row per token
    return backing[..., :rank].unsqueeze(2), backing[..., rank:].unsqueeze(2)


@pytest.mark.parametrize("seq_lens", [[], [1], [16, 17, 40]])
def test_gather_mla_cache_reads_each_requests_context_in_order(seq_lens):
    gen = torch.Generator().manual_seed(0)
    bs, nb = 16, 12
    latent_cache, rope_cache = _cache(gen, nb, bs, 32, 8, torch.float32)
    table = torch.randperm(nb, generator=gen)[: len(seq_lens) * 3].view(len(seq_lens), 3).int()
    latent, rope = ops.gather_mla_cache(latent_cache, rope_cache, table, torch.tensor(seq_lens, dtype=torch.int32))
    assert latent.shape == (sum(seq_lens), 32) and rope.shape == (sum(seq_lens), 8)
    row = 0
    for r, length in enumerate(seq_lens):
        for j in range(length):
            torch.testing.assert_close(latent[row], latent_cache[table[r, j // bs], j % bs, 0], rtol=0, atol=0)
            torch.testing.assert_close(rope[row], rope_cache[table[r, j // bs], j % bs, 0], rtol=0, atol=0)
            row += 1


def _naive_prefill(q, k_nope, k_rope, v, qsl, ksl, scale):
    q, k_nope, k_rope, v = (x.double() for x in (q, k_nope, k_rope.reshape(k_rope.shape[0], -1), v))
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=torch.float64)
    dn = k_nope.shape[2]
    for r in range(len(qsl) - 1):
        m, n = qsl[r + 1] - qsl[r], ksl[r + 1] - ksl[r]
        for i in range(m):
            pos = n - m + i
            for h in range(q.shape[1]):
                qi = q[qsl[r] + i, h]
                logits = torch.tensor([scale * (qi[:dn] @ k_nope[ksl[r] + j, h] + qi[dn:] @ k_rope[ksl[r] + j])
                                       for j in range(pos + 1)], dtype=torch.float64)
                out[qsl[r] + i, h] = torch.softmax(logits, 0) @ v[ksl[r]:ksl[r] + pos + 1, h]
    return out


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, dict(rtol=1e-4, atol=1e-5)), (torch.bfloat16, dict(rtol=3e-2, atol=3e-2))]
)
@pytest.mark.parametrize(
    ("q_lens", "kv_lens"),
    [([5], [5]), ([3, 1, 7], [3, 9, 20]), ([0, 4], [6, 4])],  # fresh prefill; chunks continuing a context; empty
)
def test_mla_prefill_attention_matches_naive(dtype, tol, q_lens, kv_lens):
    gen = torch.Generator().manual_seed(2)
    heads, dn, dr, dv = 3, 16, 8, 12
    qsl = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    ksl = [0, *torch.tensor(kv_lens).cumsum(0).tolist()]
    t, n = qsl[-1] + 2, ksl[-1]  # two padding rows past the last request
    q = torch.randn(t, heads, dn + dr, generator=gen).to(dtype)
    k_nope = torch.randn(n, heads, dn, generator=gen).to(dtype)
    k_rope = torch.randn(n, dr, generator=gen).to(dtype)
    v = torch.randn(n, heads, dv, generator=gen).to(dtype)
    scale = 1 / math.sqrt(dn + dr)
    out = torch.full((t, heads, dv), 7.0, dtype=dtype)
    ops.mla_prefill_attention(q, k_nope, k_rope, v, torch.tensor(qsl, dtype=torch.int32),
                              torch.tensor(ksl, dtype=torch.int32), scale=scale, out=out)
    expected = _naive_prefill(q, k_nope, k_rope, v, qsl, ksl, scale)
    torch.testing.assert_close(out.double(), expected, **tol)


def test_mla_prefill_attention_names_a_bad_argument():
    q = torch.zeros(4, 2, 24)
    with pytest.raises(ValueError, match="mla_prefill_attention: argument 'k_rope'"):
        ops.mla_prefill_attention(q, torch.zeros(4, 2, 16), torch.zeros(4, 5), torch.zeros(4, 2, 8),
                                  torch.tensor([0, 4]), torch.tensor([0, 4]), scale=0.1)
    with pytest.raises(ValueError, match="gather_mla_cache: argument 'seq_lens'"):
        ops.gather_mla_cache(torch.zeros(2, 16, 1, 8), torch.zeros(2, 16, 1, 4), torch.zeros(3, 2, dtype=torch.int32),
                             torch.zeros(2, dtype=torch.int32))
