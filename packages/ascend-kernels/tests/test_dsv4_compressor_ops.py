"""DeepSeek V4's compressor ops (the partial-state write, compress -> RMSNorm -> RoPE -> fp8 store into the attention
and indexer caches) against naive float64 loops and byte-level reads of vLLM's cache layouts."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

ROPE = 64


def _states(num_blocks: int, block_size: int, width: int, pad: int = 8) -> torch.Tensor:
    """A float32 state cache `[num_blocks, block_size, 2 * width]` whose block stride exceeds its size (pooled)."""
    backing = torch.zeros(num_blocks, block_size * 2 * width + pad)
    return backing[:, : block_size * 2 * width].view(num_blocks, block_size, 2 * width)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_save_partial_states_writes_kv_and_biased_score_by_slot(dtype):
    gen = torch.Generator().manual_seed(0)
    t, width, ratio = 5, 32, 4
    kv_score = torch.randn(t, 2 * width + 3, generator=gen).to(dtype)  # column views with a wider row stride
    kv, score = kv_score[:, :width], kv_score[:, width: 2 * width]
    ape = torch.randn(ratio, width, generator=gen).to(dtype)
    positions = torch.tensor([0, 5, 6, 7, 13])
    slots = torch.tensor([3, -1, 0, 9, 4])
    state = _states(3, 4, width)
    ops.dsv4_save_partial_states(kv, score, ape, positions, state, slots)
    flat = state.reshape(12, 2 * width)
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        assert torch.equal(flat[slot, :width], kv[i].float())
        expected = score[i].double() + ape[positions[i] % ratio].double()
        torch.testing.assert_close(flat[slot, width:].double(), expected, rtol=1e-6, atol=1e-6)
    assert torch.all(flat[[1, 2, 5, 6, 7, 8, 10, 11]] == 0)


def _naive_compress(flat_state, slots_row, ratio: int, d: int, weight, eps: float):
    """Per channel softmax over the window, the weighted kv sum and RMSNorm, in float64."""
    width = flat_state.shape[1] // 2
    kvs, scores = [], []
    for w, slot in enumerate(slots_row):
        if slot < 0:
            continue
        off = d if w >= ratio else 0
        kvs.append(flat_state[slot, off: off + d].double())
        scores.append(flat_state[slot, width + off: width + off + d].double())
    kv, score = torch.stack(kvs), torch.stack(scores)
    weights = score.exp() / score.exp().sum(0)
    pooled = (weights * kv).sum(0)
    return pooled / torch.sqrt(pooled.square().mean() + eps) * weight.double()


def _compress_case(d: int, ratio: int, overlap: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    width = 2 * d if overlap else d
    sbs = 4
    state = _states(6, sbs, width)
    state.copy_(torch.randn(state.shape, generator=gen))
    window = 2 * ratio if overlap else ratio
    positions = torch.tensor([ratio - 1, ratio, 2 * ratio - 1, 3 * ratio - 1, 4 * ratio - 1])
    gather = torch.randint(0, 24, (5, window), generator=gen)
    gather[3, 0] = -1  # a missing window entry is skipped
    kv_slots = torch.tensor([1, 2, 4, 6, -1])  # token 1 does not close a block, token 4 has no slot
    weight = torch.rand(d, generator=gen) + 0.5
    return state, gather, positions, kv_slots, weight


@pytest.mark.parametrize(("ratio", "overlap"), [(4, True), (2, False)])
def test_compress_norm_rope_store_pools_norms_rotates_and_stores_fp8_ds_mla(ratio, overlap, dsv4_naive):
    nope = 128
    d = nope + ROPE
    state, gather, positions, kv_slots, weight = _compress_case(d, ratio, overlap, seed=1)
    cos_sin_cache = dsv4_naive.rope_cache(32, ROPE)
    bs = 2
    record = nope + 2 * ROPE + nope // 64 + 1
    cache = torch.zeros(5, bs * record + 16, dtype=torch.uint8)[:, : bs * record]
    ops.dsv4_compress_norm_rope_store(state, gather, positions, kv_slots, weight, 1e-6, cos_sin_cache, cache, bs,
                                      ratio)
    flat = state.reshape(-1, state.shape[2])
    for i in (0, 2, 3):
        expected = _naive_compress(flat, gather[i].tolist(), ratio, d, weight, 1e-6)
        block_start = (int(positions[i]) // ratio) * ratio
        cos, sin = cos_sin_cache[block_start].double().chunk(2)
        expected[nope:] = dsv4_naive.gptj(expected[nope:], cos, sin)
        fp8, exps, pad, rope, deq = dsv4_naive.ds_mla_record(cache, bs, int(kv_slots[i]), nope)
        torch.testing.assert_close(rope, expected[nope:], rtol=2**-8, atol=1e-6)
        torch.testing.assert_close(deq[:nope], expected[:nope], rtol=2**-4 + 2**-7, atol=2**-9)
        for tile in range(nope // 64):
            block = expected[tile * 64: (tile + 1) * 64].to(torch.bfloat16).double()
            e = int(exps[tile]) - 127
            assert 448 * 2.0**e >= block.abs().max() > 448 * 2.0 ** (e - 1)  # the smallest power of two that fits
            # exact subnormals here (the compressor patches the lanes the vectorised conversion would flush)
            values = fp8[tile * 64: (tile + 1) * 64].view(torch.float8_e4m3fn).double()
            assert torch.all((values * 2.0**e - block).abs() <= block.abs() * 2**-4 + 2.0 ** (e - 10) + 1e-12)
        assert pad == 0
    written = {int(kv_slots[i]) for i in (0, 2, 3)}
    for slot in set(range(10)) - written:
        assert torch.all(dsv4_naive.ds_mla_record(cache, bs, slot, nope)[0] == 0)


def test_compress_store_keeps_fp8_subnormals_exact(dsv4_naive):
    nope, d, ratio = 64, 128, 1
    state = _states(1, 2, d)
    state[0, 0, :d] = 1.0
    state[0, 0, 1:nope:2] = 3e-5  # scale 2^-8 after the norm's ~1.0: these land on fp8 subnormals
    state[0, 0, d:] = 0.0
    cos_sin_cache = dsv4_naive.rope_cache(4, ROPE)
    cache = torch.zeros(1, 2 * (nope + 2 * ROPE + 2), dtype=torch.uint8)
    ops.dsv4_compress_norm_rope_store(state, torch.tensor([[0]]), torch.tensor([0]), torch.tensor([0]),
                                      torch.ones(d), 1e-6, cos_sin_cache, cache, 2, ratio)
    fp8, exps, _, _, _ = dsv4_naive.ds_mla_record(cache, 2, 0, nope)
    normed = (state[0, 0, :d].double() / torch.sqrt(state[0, 0, :d].double().square().mean() + 1e-6))
    block = normed[:nope].to(torch.bfloat16).double()
    e = int(exps[0]) - 127
    assert torch.equal(fp8, dsv4_naive.fp8_bytes(block / 2.0**e, flush=False))
    assert torch.all(fp8[1::2] != 0)


@pytest.mark.parametrize("head_dim", [128, 96])
def test_compress_store_indexer_quantizes_the_rotated_row_as_one_block(head_dim, dsv4_naive):
    ratio = 4
    state, gather, positions, kv_slots, weight = _compress_case(head_dim, ratio, True, seed=2)
    cos_sin_cache = dsv4_naive.rope_cache(32, ROPE)
    bs = 4
    cache = torch.zeros(3, bs * (head_dim + 4) + 12, dtype=torch.uint8)[:, : bs * (head_dim + 4)]
    ops.dsv4_compress_norm_rope_store_indexer(state, gather, positions, kv_slots, weight, 1e-6, cos_sin_cache, cache,
                                              bs, ratio)
    flat = state.reshape(-1, state.shape[2])
    nope = head_dim - ROPE
    for i in (0, 2, 3):
        expected = _naive_compress(flat, gather[i].tolist(), ratio, head_dim, weight, 1e-6)
        cos, sin = cos_sin_cache[(int(positions[i]) // ratio) * ratio].double().chunk(2)
        expected[nope:] = dsv4_naive.gptj(expected[nope:], cos, sin)
        values, scale = dsv4_naive.indexer_record(cache, bs, int(kv_slots[i]), head_dim)
        row = expected.to(torch.bfloat16).double()
        assert scale == 2.0 ** dsv4_naive.pow2_exponent(max(row.abs().max().item(), 1e-4) / 448)
        deq = values.view(torch.float8_e4m3fn).double() * scale
        torch.testing.assert_close(deq, expected, rtol=2**-4 + 2**-7, atol=scale * 2**-9)
    written = {int(kv_slots[i]) for i in (0, 2, 3)}
    for slot in set(range(12)) - written:
        assert torch.all(dsv4_naive.indexer_record(cache, bs, slot, head_dim)[0] == 0)


def test_compressor_ops_name_the_bad_argument(dsv4_naive):
    state = _states(2, 4, 256)
    cache = torch.zeros(2, 4 * (128 + 4), dtype=torch.uint8)
    args = (state, torch.zeros(1, 8, dtype=torch.long), torch.zeros(1, dtype=torch.long),
            torch.zeros(1, dtype=torch.long), torch.ones(128), 1e-6, dsv4_naive.rope_cache(4, ROPE), cache, 4, 4)
    ops.dsv4_compress_norm_rope_store_indexer(*args)
    with pytest.raises(ValueError, match="'kv_cache_2d'"):
        ops.dsv4_compress_norm_rope_store_indexer(*args[:7], cache[:, :-1], 4, 4)
    with pytest.raises(ValueError, match="'gather_slots'"):
        ops.dsv4_compress_norm_rope_store_indexer(state, torch.zeros(1, 9, dtype=torch.long), *args[2:])
    with pytest.raises(ValueError, match="'state_cache'"):
        ops.dsv4_save_partial_states(torch.zeros(2, 8), torch.zeros(2, 8), torch.zeros(4, 8),
                                     torch.zeros(2, dtype=torch.long), _states(1, 4, 4), torch.zeros(2,
                                     dtype=torch.long))
