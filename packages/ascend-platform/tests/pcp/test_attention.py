"""Partial attention over KV shards merged by log-sum-exp equals attention over the whole sequence."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ascend_platform.pcp.attention import causal_allowed, merge_attention_states, partial_attention


@pytest.mark.parametrize(("seq", "shards", "heads", "kv_heads"), [(37, 2, 4, 2), (64, 4, 2, 2), (5, 3, 4, 1)])
def test_sharded_merge_equals_full_causal_attention(seq, shards, heads, kv_heads):
    g = torch.Generator().manual_seed(seq)
    q = torch.randn(seq, heads, 32, generator=g)
    k = torch.randn(seq, kv_heads, 32, generator=g)
    v = torch.randn(seq, kv_heads, 32, generator=g)
    pos = torch.arange(seq)
    req = torch.zeros(seq, dtype=torch.long)
    scale = 32**-0.5
    # Keys split into uneven, interleaved shards, as the head-and-tail chunks of PCP ranks are.
    owner = torch.arange(seq) % shards
    outs, lses = [], []
    for s in range(shards):
        keep = owner == s
        allowed = causal_allowed(pos, req, pos[keep], req[keep], torch.ones(int(keep.sum()), dtype=torch.bool))
        out, lse = partial_attention(q, k[keep], v[keep], allowed, scale)
        outs.append(out)
        lses.append(lse)
    merged = merge_attention_states(outs, lses)
    g_ = heads // kv_heads
    ref = F.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.repeat_interleave(g_, 1).transpose(0, 1),
        v.repeat_interleave(g_, 1).transpose(0, 1),
        is_causal=True,
        scale=scale,
    ).transpose(0, 1)
    torch.testing.assert_close(merged, ref, atol=1e-5, rtol=1e-5)


def test_a_shard_with_no_visible_key_weighs_nothing():
    q = torch.randn(3, 2, 32)
    k = torch.randn(4, 2, 32)
    v = torch.randn(4, 2, 32)
    nothing = torch.zeros(3, 4, dtype=torch.bool)
    out, lse = partial_attention(q, k, v, nothing, 1.0)
    assert out.eq(0).all() and torch.isinf(lse).all()
    full, full_lse = partial_attention(q, k, v, torch.ones(3, 4, dtype=torch.bool), 1.0)
    torch.testing.assert_close(merge_attention_states([out, full], [lse, full_lse]), full)


def test_merge_needs_one_lse_per_output():
    with pytest.raises(ValueError, match="one lse per partial output"):
        merge_attention_states([torch.zeros(1, 1, 1)], [])
