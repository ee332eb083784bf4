"""mla_decode_attention against a naive per-request loop in float64."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops


@pytest.mark.parametrize(
    ("dtype", "tol"), [(torch.float32, dict(rtol=1e-4, atol=1e-5)), (torch.bfloat16, dict(rtol=2e-2, atol=2e-2))]
)
@pytest.mark.parametrize("seq_lens", [[], [1], [16, 17, 40]])  # empty, one token, on / one past a block boundary
@pytest.mark.parametrize("packed", [True, False])  # rope right after latent in one storage (vLLM's MLA cache), or not
def test_mla_decode_matches_naive(dtype, tol, seq_lens, packed):
    gen = torch.Generator().manual_seed(1)
    heads, rank, rope_dim, bs, nb = 4, 32, 8, 16, 12
    backing = torch.randn(nb, bs, rank + rope_dim, generator=gen).to(dtype)
    latent_cache, rope_cache = backing[..., :rank].unsqueeze(2), backing[..., rank:].unsqueeze(2)
    if not packed:
        rope_cache = rope_cache.clone()
    b = len(seq_lens)
    table = torch.randperm(nb, generator=gen)[: b * 3].view(b, 3).int()
    q_nope = torch.randn(b, heads, rank, generator=gen).to(dtype)
    q_rope = torch.randn(b, heads, rope_dim, generator=gen).to(dtype)
    scale = 0.1
    out = ops.mla_decode_attention(
        q_nope, q_rope, latent_cache, rope_cache, table, torch.tensor(seq_lens, dtype=torch.int32), scale=scale
    )
    assert out.shape == (b, heads, rank) and out.dtype == dtype
    for r, length in enumerate(seq_lens):
        lat = torch.stack([latent_cache[table[r, j // bs], j % bs, 0] for j in range(length)]).double()
        rope = torch.stack([rope_cache[table[r, j // bs], j % bs, 0] for j in range(length)]).double()
        for h in range(heads):
            logits = scale * (lat @ q_nope[r, h].double() + rope @ q_rope[r, h].double())
            expected = torch.softmax(logits, dim=0) @ lat
            torch.testing.assert_close(out[r, h].double(), expected, **tol)
