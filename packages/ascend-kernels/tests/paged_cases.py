"""The paged-attention cases both paged-attention test files run: a naive per-request, per-query formulation in
float64, and a runner that builds a batch over the allocator's strided caches and holds `ops.paged_attention` to it.

Loaded by conftest under the module name `paged_cases` (the tests run with --import-mode=importlib, where sibling
modules are not importable by name).
"""

from __future__ import annotations

import math

import torch

from ascend_kernels import ops

TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2),
       torch.float16: dict(rtol=3e-3, atol=3e-3)}


def naive_paged_attention(query, k_cache, v_cache, block_table, qsl, seq_lens, scale, causal, window, sinks):
    """Read each request's keys position by position, then softmax each query row over the keys it may see."""
    num_tokens, num_heads, _ = query.shape
    group = num_heads // k_cache.shape[2]
    block_size = k_cache.shape[1]
    out = torch.zeros(num_tokens, num_heads, v_cache.shape[3], dtype=torch.float64)
    for r, length in enumerate(seq_lens):
        start, end = qsl[r], qsl[r + 1]
        keys = torch.stack([k_cache[block_table[r][j // block_size], j % block_size] for j in range(length)]).double()
        values = torch.stack([v_cache[block_table[r][j // block_size], j % block_size] for j in range(length)]).double()
        for i, token in enumerate(range(start, end)):
            p = length - (end - start) + i
            visible = [j for j in range(length) if (not causal or j <= p) and (window is None or j > p - window)]
            for h in range(num_heads):
                kvh = h // group
                logits = torch.stack([scale * torch.dot(query[token, h].double(), keys[j, kvh]) for j in visible])
                weights = torch.exp(logits - logits.max())
                denominator = weights.sum()
                if sinks is not None:
                    denominator = denominator + torch.exp(sinks[h].double() - logits.max())
                out[token, h] = (weights[:, None] * values[visible, kvh]).sum(0) / denominator
    return out


def run(
    strided_caches,
    *,
    q_lens,
    seq_lens,
    heads,
    kv_heads,
    dtype,
    block_size=16,
    head=32,
    head_v=None,
    causal=True,
    window=None,
    with_sinks=False,
    padding_tokens=0,
    out=False,
    seed=0,
):
    head_v = head_v or head
    gen = torch.Generator().manual_seed(seed)
    blocks_per_req = [math.ceil(n / block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_req) + 3
    _, k_cache, v_cache = strided_caches(num_blocks, block_size, kv_heads, head, head_v, dtype, seed=seed)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(blocks_per_req, default=0) + 1  # one spare column of unrelated ids past every context
    table = []
    for n in blocks_per_req:
        row, perm = perm[:n], perm[n:]
        table.append(row + [0] * (width - n))
    block_table = torch.tensor(table, dtype=torch.int32).view(len(seq_lens), width)
    qsl = [0]
    for q in q_lens:
        qsl.append(qsl[-1] + q)
    num_tokens = qsl[-1] + padding_tokens
    query = torch.randn(num_tokens, heads, head, generator=gen).to(dtype)
    sinks = torch.randn(heads, generator=gen) if with_sinks else None
    scale = head**-0.5
    kwargs = dict(scale=scale, causal=causal, sliding_window=window, sinks=sinks)
    if out:
        kwargs["out"] = torch.full((num_tokens, heads, head_v), float("nan"), dtype=dtype)
    result = ops.paged_attention(
        query,
        k_cache,
        v_cache,
        block_table,
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(seq_lens, dtype=torch.int32),
        **kwargs,
    )
    if out:
        assert result is kwargs["out"]
    expected = naive_paged_attention(query, k_cache, v_cache, table, qsl, seq_lens, scale, causal, window, sinks)
    assert result.shape == (num_tokens, heads, head_v) and result.dtype == dtype
    torch.testing.assert_close(result.double(), expected, **TOL[dtype])
