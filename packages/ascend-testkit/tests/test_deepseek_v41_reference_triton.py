"""The float64 V4.1 reference's pieces against vLLM's own V4.1 Triton kernels, run on the CPU by Triton's interpreter
(ascend-kernels' `tests/vllm_triton.py`, the one loader, read by path): engram hashing and gating, candidate blocks,
the compressor's pooling, the indexer's query quantization.

The interpreter must be on when Triton is first imported: this module switches it on when collected, so run it on
its own or first (`pytest packages/ascend-testkit/tests/test_deepseek_v41_reference_triton.py`); if something
imported Triton earlier the tests skip, naming why.
"""

from __future__ import annotations

import sys

import pytest
import torch

from ascend_testkit.models.deepseek_v41_reference_attention import (
    Rounding,
    candidate_mask,
    fp8_pow2,
    index_queries,
    keys_from_projection,
    pool_and_norm,
    rope_angles,
)
from ascend_testkit.models.deepseek_v41_reference_engram import engram_gate, ngram_rows


def _kernels_loader():
    """ascend-kernels' anchor loader, the one this suite's conftest loaded (and switched on) before any test module
    could import Triton."""
    return sys.modules["ascend_kernels_tests_vllm_triton"]


vllm_triton = _kernels_loader()
assert vllm_triton.switch_on(), "Triton was imported before this suite's conftest switched its interpreter on"

EPS = 1e-6


@pytest.fixture(scope="module")
def engram_module():
    return vllm_triton.load("models/deepseek_v41/common/engram.py")


def _hash_with_vllm(engram_module, ids, token_map, multipliers, primes, offsets, pad_id, *, start=0, lookback=None):
    """vLLM's `_hash_ids_kernel` on one request whose chunk starts at position `start` (V2 runner: the ids before the
    chunk come as lookback ids, no slot cache)."""
    t = len(ids)
    n_layers, max_ngram = multipliers.shape
    n_heads = primes.shape[-1]
    out = torch.empty(t, n_layers, (max_ngram - 1) * n_heads, dtype=torch.int32)
    look = torch.tensor([lookback if lookback is not None else [-1] * (max_ngram - 1)], dtype=torch.int64)
    vllm_triton.launch(
        engram_module._hash_ids_kernel, (-(-t // 32), n_layers),
        torch.tensor(ids, dtype=torch.int64), torch.tensor(token_map, dtype=torch.int32),
        torch.zeros(t, dtype=torch.bool), torch.arange(start, start + t, dtype=torch.int64), None,
        torch.tensor([0, t], dtype=torch.int32), multipliers, primes, offsets, None, look,
        torch.zeros_like(look, dtype=torch.bool), out, t, 0, pad_id,
        input_stride=1, mask_stride=1, position_stride=1, table_stride=0, table_col_stride=0, query_stride=1,
        num_query_rows=1, num_table_rows=0, max_blocks=0, cache_block_size=32, MAX_NGRAM=max_ngram,
        num_heads=n_heads, BLOCK_T=32, BLOCK_H=max(1, 1 << (n_heads - 1).bit_length()), dead_id=-1,
        lookback_depth=look.shape[1], lookback_row_stride=look.stride(0), lookback_col_stride=look.stride(1),
        lookback_mask_row_stride=look.stride(0), lookback_mask_col_stride=look.stride(1), num_warps=4)
    return out


def _layout():
    from types import SimpleNamespace

    from ascend_testkit.models.deepseek_v41 import TinyDeepseekV41Spec, engram_primes
    from ascend_testkit.models.deepseek_v41_reference_engram import hash_multipliers

    spec = TinyDeepseekV41Spec()
    vocab = 1000
    token_map = [(7 * i) % 997 for i in range(vocab)]  # some ids collapse: the map is not the identity
    primes = engram_primes(spec)
    flat = [[p for per in layer for p in per] for layer in primes]
    return SimpleNamespace(
        token_map=token_map, primes=primes,
        multipliers=torch.tensor(hash_multipliers(spec.engram_layer_ids, spec.engram_max_ngram_size, 997)),
        primes_t=torch.tensor(primes), offsets=torch.tensor([[sum(f[:i]) for i in range(len(f))] for f in flat]))


def test_ngram_rows_match_vllms_hash_kernel(engram_module):
    lay = _layout()
    ids = [5, 900, 17, 17, 3, 999, 0, 42, 5, 900, 17, 8]
    pad = lay.token_map[0]
    got = _hash_with_vllm(engram_module, ids, lay.token_map, lay.multipliers, lay.primes_t, lay.offsets, pad)
    compressed = [lay.token_map[i] for i in ids]
    for layer in range(len(lay.primes)):
        want = ngram_rows(compressed, pad, lay.multipliers[layer].tolist(), lay.primes[layer])
        assert got[:, layer].tolist() == want


def test_a_chunk_with_lookback_ids_hashes_like_the_whole_sequence(engram_module):
    """The engine hashes chunk by chunk with the ids before the chunk as lookback: the reference's full-sequence
    rows are what every chunk must reproduce."""
    lay = _layout()
    ids = [5, 900, 17, 17, 3, 999, 0, 42, 5, 900, 17, 8]
    pad = lay.token_map[0]
    whole = _hash_with_vllm(engram_module, ids, lay.token_map, lay.multipliers, lay.primes_t, lay.offsets, pad)
    chunk = _hash_with_vllm(engram_module, ids[7:], lay.token_map, lay.multipliers, lay.primes_t, lay.offsets, pad,
                            start=7, lookback=[ids[6], ids[5]])  # column c holds the id at chunk start - 1 - c
    assert torch.equal(chunk, whole[7:])


def test_engram_gate_matches_vllms_fused_kernel(engram_module):
    g = torch.Generator().manual_seed(4)
    t, hc, hidden = 6, 2, 64
    residual = torch.randn(t, hc, hidden, generator=g) * 2
    kv = torch.randn(t, (hc + 1) * hidden, generator=g) * 3
    kv[0, :hidden] = -residual[0, 0]  # a negative dot: the signed square root
    q_w = (1 + 0.2 * torch.randn(hc, hidden, generator=g)).to(torch.bfloat16)
    k_w = (1 + 0.2 * torch.randn(hc, hidden, generator=g)).to(torch.bfloat16)
    out = torch.empty_like(residual)
    keep = torch.ones(t, dtype=torch.bool)
    keep[-1] = False  # an image-span position: its gate is shut
    vllm_triton.launch(
        engram_module._fused_engram_post_wkv_kernel, (t * hc,), residual, kv, q_w, k_w, keep, out, t,
        *residual.stride(), *kv.stride(), *q_w.stride(), *k_w.stride(), keep.stride(0), *out.stride(), EPS, 1e-6,
        DIM=hidden, HC_MULT=hc, BLOCK_SIZE=hidden, HAS_MASK=True, num_warps=4)
    want = engram_gate(residual.double(), kv.double(), q_w.double(), k_w.double(), EPS)
    want[-1] = residual[-1].double()
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_candidate_blocks_match_vllms_select_and_mask():
    cb = vllm_triton.load("model_executor/kernels/attention/dsa/candidate_blocks.py",
                          {**vllm_triton.TRITON_IMPORTS, "assert logits.is_cuda": "pass"})
    g = torch.Generator().manual_seed(5)
    t, width, block, k = 24, 24, 4, 3
    logits = torch.randn(t, width, generator=g)
    ends = torch.arange(1, t + 1, dtype=torch.int32)  # ratio 1: row p sees entries 0..p
    causal = torch.arange(width)[None, :] < ends[:, None]
    out = torch.full((t, k), -7, dtype=torch.int32)
    cb.select_candidate_blocks(logits.clone(), None, ends, k, block, out)
    want = candidate_mask(logits.double().masked_fill(~causal, float("-inf")), block, k)
    for row in range(t):
        chosen = {b for b in out[row].tolist() if b >= 0}
        assert chosen == set((want[row].nonzero().flatten() // block).tolist()), row
    consumer = torch.randn(t, width, generator=g)
    masked = consumer.clone()
    cb.apply_candidate_mask(masked, None, ends, out, block)
    expected = consumer.masked_fill(~want, float("-inf"))
    assert torch.equal(torch.isinf(masked), torch.isinf(expected))
    torch.testing.assert_close(masked[~torch.isinf(masked)], expected[~torch.isinf(expected)])


@pytest.mark.parametrize("ratio", [1, 2])
def test_compressor_pooling_matches_vllms_fused_save_compress_norm(ratio):
    fc = vllm_triton.load("models/deepseek_v41/common/ops/fused_compress_quant_cache.py",
                          {**vllm_triton.TRITON_IMPORTS, **vllm_triton.NO_GPU_PLATFORM,
                           "from vllm.models.deepseek_v4.common.ops.fused_indexer_q import _fp32x2_to_fp4x2":
                           "_fp32x2_to_fp4x2 = None"})
    g = torch.Generator().manual_seed(6)
    t, cap = 11, 8
    kv_score = torch.randn(t, 512 * ratio, generator=g) * 3
    weight = (1 + 0.2 * torch.randn(512, generator=g)).to(torch.bfloat16)
    positions = torch.arange(t, dtype=torch.int64)
    latent = torch.zeros(t, 512, dtype=torch.bfloat16)
    if ratio == 2:
        state = torch.zeros(2, cap, 1024)
        fc.fused_save_compress_norm(kv_score, positions, state, 1 * cap + positions % cap,
                                    torch.tensor([0, t], dtype=torch.int32), torch.zeros(t, dtype=torch.int32),
                                    weight, EPS, ratio, latent)
        rows, kv, score = positions[1::2], kv_score[:, :512], kv_score[:, 512:]
    else:
        fc.fused_save_compress_norm(kv_score, positions, None, positions, None, None, weight, EPS, ratio, latent)
        rows, kv, score = positions, kv_score, None
    want = pool_and_norm(kv.double(), None if score is None else score.double(), ratio, weight.double(), EPS,
                         Rounding())
    assert want.shape[0] == rows.numel()
    torch.testing.assert_close(latent[rows].double(), want, rtol=1e-2, atol=1e-2)  # one bf16 ulp at most
    assert (latent[rows].double() == want).float().mean() > 0.99


def test_index_queries_match_vllms_fused_indexer_q_rope_quant():
    fq = vllm_triton.load("models/deepseek_v4/common/ops/fused_indexer_q.py", {
        **vllm_triton.TRITON_IMPORTS,
        "from vllm.platforms import current_platform":  # a GPU with OCP fp8: the Triton kernel's path
        "import torch as _torch\nfrom types import SimpleNamespace\n"
        "current_platform = SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: True, is_xpu=lambda: False,\n"
        "    is_cpu=lambda: False, fp8_dtype=lambda: _torch.float8_e4m3fn)"})
    g = torch.Generator().manual_seed(7)
    t, heads = 9, 4
    q = torch.randn(t, heads, 128, generator=g) * 4
    positions = torch.arange(3, 3 + t, dtype=torch.int64)
    cos, sin = rope_angles(torch.arange(64), 160000.0)
    cache = torch.cat((cos, sin), dim=-1).float()
    weights = torch.randn(t, heads, generator=g)
    q_fp8, weights_out = fq.fused_indexer_q_rope_quant(positions, q, cache, weights, 128**-0.5, heads**-0.5)
    q_scale = weights_out / (weights * 128**-0.5 * heads**-0.5)
    got = q_fp8.double() * q_scale.double().unsqueeze(-1)
    want = index_queries(q.double(), positions, 160000.0, Rounding())
    close = torch.isclose(got, want, rtol=0.07, atol=1e-3)  # one fp8 step at most
    assert close.all() and (got == want).float().mean() > 0.99
    assert torch.equal(fp8_pow2(want), want)  # already on the fp8 grid


@pytest.mark.parametrize("ratio", [1, 2])
def test_index_keys_match_vllms_indexer_k_norm_rope_store(ratio):
    ks = vllm_triton.load("models/deepseek_v41/common/ops/indexer_k_store.py", {
        **vllm_triton.TRITON_IMPORTS, **vllm_triton.NO_GPU_PLATFORM,
        "from . import MXFP4_BLOCK_SIZE, _fp32x2_to_fp4x2":  # the MXFP4 path only (not taken here)
        "from vllm.models.deepseek_v41.common.ops import MXFP4_BLOCK_SIZE, _fp32x2_to_fp4x2"})
    g = torch.Generator().manual_seed(8)
    t, blocks, block_size = 13, 2, 16
    k_pre = (torch.randn(t, 128, generator=g) * 5).to(torch.bfloat16)
    weight = 1 + 0.2 * torch.randn(128, generator=g)
    positions = torch.arange(t, dtype=torch.int64)
    boundary = (positions + 1) % ratio == 0
    slots = torch.where(boundary, positions // ratio, -1)
    cos, sin = rope_angles(torch.arange(64), 160000.0)
    cache = torch.zeros(blocks, block_size, 132, dtype=torch.uint8)
    ks.indexer_k_norm_rope_store(k_pre, positions, torch.cat((cos, sin), -1).float(), weight, EPS, cache, slots,
                                 ratio, False)
    flat = cache.view(blocks, -1)
    values = flat[:, : block_size * 128].reshape(blocks * block_size, 128).view(torch.float8_e4m3fn)
    scales = flat[:, block_size * 128:].reshape(blocks * block_size, 4).view(torch.float32)
    entries = int(boundary.sum())
    got = values[:entries].double() * scales[:entries].double()
    want = keys_from_projection(k_pre[boundary].double(), weight.double(), ratio, 160000.0, EPS, Rounding())
    close = torch.isclose(got, want, rtol=0.07, atol=1e-3)  # one fp8 step at most
    assert close.all() and (got == want).float().mean() > 0.99
