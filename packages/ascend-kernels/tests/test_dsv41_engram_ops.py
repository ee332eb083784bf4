"""DeepSeek V4.1's Engram ops against Python-int / float64 loops and vLLM's own Triton kernels (engram.py, the hash,
lookup and gate kernels interpreted on the CPU, launched as vLLM launches them)."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops

ENGRAM = "models/deepseek_v41/common/engram.py"
LAYERS, NGRAM, HEADS, VOCAB, COMPRESSED = 2, 3, 3, 40, 25
PAD = 7


def _tables(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    token_map = torch.randint(0, COMPRESSED, (VOCAB,), generator=gen, dtype=torch.int32)
    multipliers = torch.randint(0, 1 << 40, (LAYERS, NGRAM), generator=gen, dtype=torch.int64) * 2 + 1
    primes = torch.tensor([[[101, 103, 107], [109, 113, 127]], [[131, 137, 139], [149, 151, 157]]])
    offsets = torch.cumsum(torch.cat((torch.zeros(LAYERS, 1, dtype=torch.int64), primes.flatten(1)[:, :-1]), 1), 1)
    return token_map, multipliers, primes, offsets


def _naive_hashes(history: list[int], dead: set[int], positions, token_map, multipliers, primes, offsets):
    """Python ints: the n-grams ending at each position of one request's full token history."""
    rows = []
    for p in positions:
        per_layer = []
        for layer in range(LAYERS):
            rolling, blocked, cols = 0, False, []
            for s in range(NGRAM):
                q = p - s
                source = -1 if q < 0 or q in dead else int(token_map[history[q]])
                blocked = blocked or q < 0 or source == -1
                rolling ^= (PAD if blocked else source) * int(multipliers[layer, s])
                rolling &= (1 << 64) - 1  # int64 wrap-around (never reached: multipliers keep products in range)
                if s:
                    cols += [rolling % int(primes[layer, s - 1, h]) + int(offsets[layer, (s - 1) * HEADS + h])
                             for h in range(HEADS)]
            per_layer.append(cols)
        rows.append(per_layer)
    return torch.tensor(rows, dtype=torch.int32)


def _history(seed: int, n: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_engram_hash_with_lookback_ids_matches_the_full_history():
    """Model Runner V2: each chunk sees only its tokens plus `max_ngram - 1` lookback ids per request."""
    token_map, mult, primes, offsets = _tables()
    h0, h1 = _history(1, 9), _history(2, 6)
    # request 0 runs positions 5..8 (chunked prefill, 5 earlier tokens), request 1 positions 0..5 (a whole prompt)
    ids = torch.tensor(h0[5:] + h1)
    pos = torch.tensor(list(range(5, 9)) + list(range(6)))
    qsl = torch.tensor([0, 4, 10])
    lookback = torch.tensor([[h0[4], h0[3]], [-1, -1]])  # column 0: the token right before the chunk
    got = ops.dsv41_engram_hash(ids, token_map, None, pos, None, qsl, mult, primes, offsets, None, lookback, None,
                                PAD)
    want = torch.cat((_naive_hashes(h0, set(), range(5, 9), token_map, mult, primes, offsets),
                      _naive_hashes(h1, set(), range(6), token_map, mult, primes, offsets)))
    assert got.shape == (10, LAYERS, (NGRAM - 1) * HEADS) and got.dtype == torch.int32
    assert torch.equal(got, want)
    # an unknown lookback id (-1; position 3) without a history cache reads pad_id: only the 3-gram through it changes
    unknown = ops.dsv41_engram_hash(ids, token_map, None, pos, None, qsl, mult, primes, offsets, None,
                                    torch.tensor([[h0[4], -1], [-1, -1]]), None, PAD)
    assert torch.equal(unknown[1:], want[1:]) and torch.equal(unknown[0, :, :HEADS], want[0, :, :HEADS])
    assert not torch.equal(unknown[0, :, HEADS:], want[0, :, HEADS:])


def test_engram_hash_from_the_v1_slot_history_and_dead_tokens():
    """V1 runner: earlier tokens come from the slot-keyed history written by dsv41_engram_write_hash_cache."""
    token_map, mult, primes, offsets = _tables(3)
    h = _history(4, 12)
    bs = 4
    block_table = torch.tensor([[2, 0, 3]])
    slots = lambda ps: torch.tensor([int(block_table[0, p // bs]) * bs + p % bs for p in ps])  # noqa: E731
    cache = torch.full((16,), 99, dtype=torch.int32)
    ops.dsv41_engram_write_hash_cache(torch.tensor(h[:7]), token_map, None, slots(range(7)), cache)
    assert [int(cache[s]) for s in slots(range(7))] == [int(token_map[t]) for t in h[:7]]
    dead = torch.tensor([False, True, False, False, False])  # position 8 takes no part in n-grams
    got = ops.dsv41_engram_hash(torch.tensor(h[7:]), token_map, dead, torch.arange(7, 12), block_table,
                                torch.tensor([0, 5]), mult, primes, offsets, cache, None, None, PAD, bs)
    assert torch.equal(got, _naive_hashes(h, {8}, range(7, 12), token_map, mult, primes, offsets))


def test_engram_lookup_dequantizes_ue8m0_blocks():
    gen = torch.Generator().manual_seed(5)
    weight = (torch.randn(10, 64, generator=gen) * 4).to(torch.float8_e4m3fn)
    scales = torch.randint(120, 134, (10, 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    indices = torch.tensor([[3, -1], [9, 10]])  # -1 (DEAD_ID) and 10 (past the table) read zeros
    out = ops.dsv41_engram_lookup(weight, scales, indices, torch.empty(2, 2, 64))
    for t in range(2):
        for c in range(2):
            i = int(indices[t, c])
            if not 0 <= i < 10:
                assert torch.all(out[t, c] == 0)
                continue
            want = [float(weight[i, d].float()) * 2.0 ** (int(scales[i, d // 32]) - 127) for d in range(64)]
            assert out[t, c].tolist() == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_engram_gate_matches_naive(dtype):
    gen = torch.Generator().manual_seed(6)
    t, hc, d = 4, 2, 16
    hidden = torch.randn(t, hc, d, generator=gen).to(dtype)
    kv = torch.randn(3, (hc + 1) * d, generator=gen).to(dtype)  # one token short: row 3 passes through
    qw, kw = torch.rand(hc, d, generator=gen) + 0.5, torch.rand(hc, d, generator=gen) + 0.5
    mask = torch.tensor([True, False, True])
    out = ops.dsv41_engram_gate(hidden, kv, qw, kw, mask, 1e-6, 1e-6)
    assert out.dtype == dtype and out.shape == hidden.shape
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 2e-2}[dtype]
    for i in range(t):
        for j in range(hc):
            h = hidden[i, j].double()
            if i >= 3:
                assert torch.equal(out[i, j], hidden[i, j])
                continue
            key, value = kv[i, j * d:(j + 1) * d].double(), kv[i, hc * d:].double()
            dot = float((h * qw[j].double() * kw[j].double() * key).sum())
            dot /= math.sqrt(float(h.square().mean()) + 1e-6) * math.sqrt(float(key.square().mean()) + 1e-6)
            dot /= math.sqrt(d)
            gate = 0.0 if not mask[i] else 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(dot), 1e-6)), dot)))
            torch.testing.assert_close(out[i, j].double(), h + gate * value, rtol=tol, atol=tol)


# ----------------------------------------------------------------------- anchors: vLLM's Triton kernels, interpreted

_PRELUDE = ("import numpy as np\nimport torch\nimport triton\nimport triton.language as tl\n"
            "from types import SimpleNamespace\n"
            "current_platform = SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: False)\n")


def test_engram_hash_matches_vllm_triton_kernels(vllm_triton):
    mod = vllm_triton.load_slice(ENGRAM, "DEAD_ID = -1", "class NgramHashState", _PRELUDE)
    token_map, _, _, _ = _tables(7)
    # vLLM's own layout and multipliers, from a config stand-in
    from types import SimpleNamespace
    config = SimpleNamespace(engram_layer_ids=[1, 4], engram_num_embeddings=[2000, 2000], engram_max_ngram_size=NGRAM,
                             engram_n_heads=HEADS, engram_head_dim=32, engram_compressed_vocab_size=COMPRESSED,
                             engram_pad_token_id=0, engram_vocab_size=50)
    layout = mod.EngramLayout(config)
    mult = mod.compute_hash_multipliers(layout.layer_ids, NGRAM, COMPRESSED)
    primes, offsets = torch.tensor(layout.primes), layout.offsets
    h0, h1 = _history(8, 11), _history(9, 5)
    ids = torch.tensor(h0[6:] + h1)
    pos = torch.tensor(list(range(6, 11)) + list(range(5)))
    qsl = torch.tensor([0, 5, 10], dtype=torch.int32)
    dead = torch.zeros(10, dtype=torch.bool)
    dead[7] = True
    lookback = torch.tensor([[h0[5], -1], [-1, -1]])
    lookback_dead = torch.zeros(2, 2, dtype=torch.bool)
    bs = 4
    block_table = torch.tensor([[1, 0, 2], [3, 4, 5]], dtype=torch.int32)
    slot_mapping = torch.tensor([int(block_table[r, p // bs]) * bs + p % bs
                                 for r, ps in ((0, range(6, 11)), (1, range(5))) for p in ps])
    pad_id = int(token_map[0])
    for use_cache in (False, True):
        ours_cache = theirs_cache = None
        if use_cache:  # the V1 history holds request 0's earlier tokens, then this step's
            ours_cache = torch.zeros(24, dtype=torch.int32)
            earlier = torch.tensor([int(block_table[0, p // bs]) * bs + p % bs for p in range(6)])
            ops.dsv41_engram_write_hash_cache(torch.tensor(h0[:6]), token_map, None, earlier, ours_cache)
            theirs_cache = ours_cache.clone()
            ops.dsv41_engram_write_hash_cache(ids, token_map, dead, slot_mapping, ours_cache)
        got = ops.dsv41_engram_hash(ids, token_map, dead, pos, block_table, qsl, mult, primes, offsets, ours_cache,
                                    lookback, lookback_dead, pad_id, bs)
        want = torch.empty(10, LAYERS, (NGRAM - 1) * HEADS, dtype=torch.int32)
        with vllm_triton.interpreting():
            if use_cache:
                mod._write_hash_cache_kernel[(1,)](ids, token_map, dead, slot_mapping, theirs_cache, 10, 1, 1, 1, 256,
                                                   mod.DEAD_ID)
            mod._hash_ids_kernel[(1, LAYERS)](
                ids, token_map, dead, pos, block_table, qsl, mult, primes, offsets, theirs_cache, lookback,
                lookback_dead, want, 10, theirs_cache.shape[0] if use_cache else 0, pad_id, input_stride=1,
                mask_stride=1, position_stride=1, table_stride=block_table.stride(0), table_col_stride=1,
                query_stride=1, num_query_rows=2, num_table_rows=2, max_blocks=3, cache_block_size=bs,
                MAX_NGRAM=NGRAM, num_heads=HEADS, BLOCK_T=32, BLOCK_H=4, dead_id=mod.DEAD_ID, lookback_depth=2,
                lookback_row_stride=2, lookback_col_stride=1, lookback_mask_row_stride=2, lookback_mask_col_stride=1)
        if use_cache:
            assert torch.equal(ours_cache, theirs_cache)
        assert torch.equal(got, want), use_cache


def test_engram_lookup_and_gate_match_vllm_triton_kernels(vllm_triton):
    lookup = vllm_triton.load_slice(ENGRAM, "_SORTED_IS_CONSTEXPR = tl.constexpr(", "def engram_head_shard_rank",
                                    _PRELUDE)
    # the token's validity and its mask load become vectors (the same value per lane): the interpreter types the
    # scalar comparison int64, which its loads reject as a mask
    gate = vllm_triton.load_slice(ENGRAM, '@triton.jit(do_not_specialize=["num_kv_tokens"])',
                                  '@triton.jit(do_not_specialize=["num_tokens", "token_start", "num_elements"])',
                                  _PRELUDE, {"source_valid = source_idx < num_kv_tokens":
                                             "source_valid = source_idx + tl.zeros([BLOCK_SIZE], tl.int64) < "
                                             "num_kv_tokens",
                                             "token_mask + source_idx * mask_stride,":
                                             "token_mask + source_idx * mask_stride + tl.zeros([BLOCK_SIZE], tl.int64),"
                                             })
    gen = torch.Generator().manual_seed(10)
    weight = (torch.randn(12, 64, generator=gen) * 4).to(torch.float8_e4m3fn)
    scales = torch.randint(118, 136, (12, 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    indices = torch.tensor([[3, -1, 11], [0, 12, 5]], dtype=torch.int32)
    ours = ops.dsv41_engram_lookup(weight, scales, indices, torch.empty(2, 3, 64))
    theirs = torch.empty(2, 3, 64, dtype=torch.bfloat16)
    with vllm_triton.interpreting():
        lookup._engram_lookup_kernel[(1,)](weight, scales, indices, indices, theirs, 0, 12, 6, 3, 1, HEAD_START=0,
                                           LOCAL_HEADS=3, TOTAL_HEADS=3, DIM=64, QUANT_BLOCK=32, BLOCK_R=16, GRID=1,
                                           SORTED=False, PACKED=False, OUT_STRIDE=theirs.stride(0))
    assert torch.equal(ours, theirs.float())

    t, hc, d = 5, 2, 32
    hidden = torch.randn(t, hc, d, generator=gen).to(torch.bfloat16)
    kv = torch.randn(4, (hc + 1) * d, generator=gen).to(torch.bfloat16)
    qw, kw = (torch.rand(hc, d, generator=gen) + 0.5).to(torch.bfloat16), (torch.rand(hc, d, generator=gen) + 0.5)
    kw = kw.to(torch.bfloat16)
    mask = torch.tensor([True, True, False, True])
    ours = ops.dsv41_engram_gate(hidden, kv, qw, kw, mask, 1e-6, 1e-6)
    theirs = torch.empty_like(hidden)
    with vllm_triton.interpreting():
        gate._fused_engram_post_wkv_kernel[(t * hc,)](
            hidden, kv, qw, kw, mask, theirs, 4, *hidden.stride(), *kv.stride(), *qw.stride(), *kw.stride(),
            mask.stride(0), *theirs.stride(), 1e-6, 1e-6, DIM=d, HC_MULT=hc, BLOCK_SIZE=d, HAS_MASK=True)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2.0**-7, atol=1e-6)
    assert torch.equal(theirs[4], hidden[4]) and torch.equal(ours[4], hidden[4])


def test_engram_validation_names_the_argument():
    token_map, mult, primes, offsets = _tables()
    with pytest.raises(ValueError, match="dsv41_engram_hash: argument 'offsets'"):
        ops.dsv41_engram_hash(torch.zeros(2, dtype=torch.long), token_map, None, torch.arange(2), None,
                              torch.tensor([0, 2]), mult, primes, offsets[:, :3], None, None, None, PAD)
    with pytest.raises(ValueError, match="dsv41_engram_lookup: argument 'weight_scale_inv'"):
        ops.dsv41_engram_lookup(torch.zeros(4, 64), torch.zeros(4, 3, dtype=torch.uint8),
                                torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1, 64))
    with pytest.raises(ValueError, match="dsv41_engram_gate: argument 'kv'"):
        ops.dsv41_engram_gate(torch.zeros(2, 2, 8), torch.zeros(2, 16), torch.ones(2, 8), torch.ones(2, 8), None,
                              1e-6, 1e-6)
