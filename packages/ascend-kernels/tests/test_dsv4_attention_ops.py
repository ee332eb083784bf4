"""DeepSeek V4's attention ops (query norm + RoPE with the sliding-window insert, sparse MLA with a sink, the output's
inverse RoPE) against naive float64 formulations and byte-level reads of vLLM's fp8_ds_mla layout."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

NOPE, ROPE = 128, 64  # a small head (vLLM's is 448 + 64); the layout only needs nope to be a multiple of 64
D = NOPE + ROPE
RECORD = NOPE + 2 * ROPE + NOPE // 64 + 1


def _pooled_cache(num_blocks: int, block_size: int, pad: int = 40) -> torch.Tensor:
    """A 2-D fp8_ds_mla view whose row stride exceeds its width (a layer's page in a pooled allocation)."""
    backing = torch.zeros(num_blocks, block_size * RECORD + pad, dtype=torch.uint8)
    return backing[:, : block_size * RECORD]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qnorm_rope_kv_insert_normalizes_rotates_pads_and_stores_ue8m0_records(dtype, dsv4_naive):
    gen = torch.Generator().manual_seed(0)
    t, h, padded, bs = 5, 3, 4, 4
    q = (torch.randn(t, h, D, generator=gen) * 3).to(dtype)
    kv = (torch.randn(t, D, generator=gen) * 2).to(dtype)
    kv[0, :64] = torch.where(torch.arange(64) % 3 == 0, 3e-5, 1.0).to(dtype)  # fp8 subnormals: flushed to zero
    positions = torch.tensor([7, 0, 31, 12, 3])
    slots = torch.tensor([5, -1, 0, 11])  # 4 tokens inserted (the 5th is not), one padding slot
    cos_sin_cache = dsv4_naive.rope_cache(64, ROPE)
    cache = _pooled_cache(3, bs)
    q_out = ops.dsv4_qnorm_rope_kv_insert(q, kv, positions, cache, slots, cos_sin_cache, padded, 1e-6, bs)

    assert q_out.shape == (t, padded, D) and q_out.dtype == dtype
    assert torch.all(q_out[:, h:] == 0)
    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=1)
    x = q.double()
    x = x / torch.sqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    x[..., NOPE:] = dsv4_naive.gptj(x[..., NOPE:], cos.unsqueeze(1), sin.unsqueeze(1))
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(q_out[:, :h].double(), x, **tol)

    written = set()
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        fp8, exps, pad, rope, deq = dsv4_naive.ds_mla_record(cache, bs, slot, NOPE)
        nope = kv[i, :NOPE].double().to(torch.bfloat16).double()  # nope is not rotated: its bf16 rounding is exact
        for tile in range(NOPE // 64):
            block = nope[tile * 64: (tile + 1) * 64]
            e = dsv4_naive.pow2_exponent(max(block.abs().max().item() / 448, 1e-4))
            assert int(exps[tile]) == e + 127
            assert torch.equal(fp8[tile * 64: (tile + 1) * 64], dsv4_naive.fp8_bytes(block / 2.0**e, flush=True))
        assert pad == 0
        expected_rope = dsv4_naive.gptj(kv[i, NOPE:].double(), cos[i], sin[i])
        torch.testing.assert_close(rope, expected_rope, rtol=2**-8, atol=1e-6)
        torch.testing.assert_close(deq[:NOPE], kv[i, :NOPE].double(), rtol=2**-4 + 2**-8, atol=2**-8)
    fp8_first = dsv4_naive.ds_mla_record(cache, bs, 5, NOPE)[0]
    assert torch.all(fp8_first[:64][torch.arange(64) % 3 == 0] == 0)  # the flushed subnormals
    untouched = [s for s in range(3 * bs) if s not in written]
    assert all(torch.all(dsv4_naive.ds_mla_record(cache, bs, s, NOPE)[0] == 0) for s in untouched)


def _random_records(cache: torch.Tensor, block_size: int, gen: torch.Generator) -> None:
    """Fill every record with finite fp8 values (bytes 0..0x7e, random sign), exponents 2^-3..2^2, bf16 ropes."""
    token_bytes = NOPE + 2 * ROPE
    for p in range(block_size):
        n = cache.shape[0]
        values = torch.randint(0, 0x7F, (n, NOPE), generator=gen, dtype=torch.uint8)
        values |= (torch.rand(n, NOPE, generator=gen) < 0.5).to(torch.uint8) * 0x80
        rope = torch.randn(n, ROPE, generator=gen).to(torch.bfloat16).view(torch.uint8)
        cache[:, p * token_bytes: (p + 1) * token_bytes] = torch.cat((values, rope), dim=1)
        exps = torch.randint(124, 130, (n, NOPE // 64), generator=gen, dtype=torch.uint8)
        start = block_size * token_bytes + p * (NOPE // 64 + 1)
        cache[:, start: start + NOPE // 64] = exps


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sparse_mla_attends_window_and_compressed_records_with_a_sink(dtype, dsv4_naive):
    gen = torch.Generator().manual_seed(1)
    t, h, wbs, cbs = 4, 5, 4, 2
    window, compressed = _pooled_cache(3, wbs), _pooled_cache(4, cbs)
    _random_records(window, wbs, gen)
    _random_records(compressed, cbs, gen)
    q = (torch.randn(t, h, D, generator=gen) * 0.05).to(dtype)
    window_slots = torch.tensor([[0, 5, 11, -1], [3, -1, -1, -1], [-1, 12, -1, -1], [7, 2, 1, 9]])  # 12: out of range
    compressed_slots = torch.tensor([[1, 6, -1], [-1, -1, -1], [-1, -1, -1], [0, 7, 3]])
    sink = torch.randn(h, generator=gen)
    scale = D**-0.5
    out = torch.full((t, h, D), 7.0, dtype=dtype)
    ops.dsv4_sparse_mla_with_kvcache(out, q, window, window_slots, wbs, compressed, compressed_slots, cbs, sink,
                                     scale)

    for i in range(t):
        keys = [dsv4_naive.ds_mla_record(window, wbs, s, NOPE)[4] for s in window_slots[i].tolist() if 0 <= s < 12]
        keys += [dsv4_naive.ds_mla_record(compressed, cbs, s, NOPE)[4] for s in compressed_slots[i].tolist() if s >= 0]
        if not keys:
            assert torch.all(out[i] == 0)  # no valid slot: zeros, not the sink's share of nothing
            continue
        k = torch.stack(keys)
        for head in range(h):
            logits = (q[i, head].double() @ k.T) * scale
            denom = logits.exp().sum() + torch.exp(sink[head].double())
            expected = (logits.exp() / denom) @ k
            tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(out[i, head].double(), expected, **tol)


def test_sparse_mla_with_no_compressed_entries_reads_only_the_window(dsv4_naive):
    gen = torch.Generator().manual_seed(2)
    window = _pooled_cache(2, 4)
    _random_records(window, 4, gen)
    q = torch.randn(2, 3, D, generator=gen) * 0.05
    slots = torch.tensor([[0, 1, 2], [6, -1, -1]])
    out = torch.empty(2, 3, D)
    sink = torch.full((3,), -1e4)  # a vanishing sink: plain softmax attention
    ops.dsv4_sparse_mla_with_kvcache(out, q, window, slots, 4, window, slots.new_empty(2, 0), 1, sink, 0.1)
    k = dsv4_naive.ds_mla_record(window, 4, 6, NOPE)[4]
    torch.testing.assert_close(out[1].double(), k.expand(3, D), rtol=1e-6, atol=1e-6)  # one key: its record


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_inverse_rope_o_proj_rotates_the_rope_dims_back(dtype, dsv4_naive):
    gen = torch.Generator().manual_seed(3)
    o = torch.randn(4, 3, D, generator=gen).to(dtype)
    positions = torch.tensor([0, 9, 33, 2])
    cos_sin_cache = dsv4_naive.rope_cache(40, ROPE)
    out = ops.dsv4_inverse_rope_o_proj(o, positions, cos_sin_cache, ROPE)
    assert out.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=1)
    x = o.double()
    assert torch.equal(out[..., :NOPE].double(), x[..., :NOPE])
    expected = dsv4_naive.gptj(x[..., NOPE:], cos.unsqueeze(1), -sin.unsqueeze(1))
    torch.testing.assert_close(out[..., NOPE:].double(), expected, rtol=1e-6, atol=1e-6)
    # and it undoes the forward rotation
    forward = x.clone()
    forward[..., NOPE:] = dsv4_naive.gptj(x[..., NOPE:], cos.unsqueeze(1), sin.unsqueeze(1))
    back = ops.dsv4_inverse_rope_o_proj(forward.to(dtype), positions, cos_sin_cache, ROPE)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype != torch.bfloat16 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(back.double(), x, **tol)


def test_attention_ops_name_the_bad_argument(dsv4_naive):
    q = torch.randn(2, 3, D)
    cache = _pooled_cache(2, 4)
    cos_sin_cache = dsv4_naive.rope_cache(8, ROPE)
    with pytest.raises(ValueError, match="'q_head_padded'"):
        ops.dsv4_qnorm_rope_kv_insert(q, q[:, 0], torch.zeros(2, dtype=torch.long), cache, torch.zeros(2,
                                      dtype=torch.long), cos_sin_cache, 2, 1e-6, 4)
    with pytest.raises(ValueError, match="'swa_kv_cache_2d'"):
        ops.dsv4_qnorm_rope_kv_insert(q, q[:, 0], torch.zeros(2, dtype=torch.long), cache[:, :-1],
                                      torch.zeros(2, dtype=torch.long), cos_sin_cache, 3, 1e-6, 4)
    with pytest.raises(ValueError, match="'attn_sink'"):
        ops.dsv4_sparse_mla_with_kvcache(torch.empty_like(q), q, cache, torch.zeros(2, 1, dtype=torch.long), 4,
                                         cache, torch.zeros(2, 0, dtype=torch.long), 1, torch.zeros(2), 0.1)
    with pytest.raises(ValueError, match="'rope_dim'"):
        ops.dsv4_inverse_rope_o_proj(q, torch.zeros(2, dtype=torch.long), cos_sin_cache, 63)
