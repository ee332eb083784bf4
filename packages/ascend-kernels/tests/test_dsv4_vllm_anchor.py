"""The DeepSeek V4 ops against vLLM's own CPU ops (`vllm._custom_ops.*_cpu`), at the shapes and dtypes those accept
(bf16 activations, head_dim 512 = 448 + 64, indexer head_dim 128, top-512).

vLLM ships these ops only in its AVX512-BF16 build (`vllm/_C.abi3.so`); importing it on a CPU without AVX512-BF16
kills the process with SIGILL, so the module skips there (vLLM's own `CpuPlatform.import_kernels` makes the same
check). Where the upstream kernels round differently by construction (FMA in their RoPE, a bf16 copy of the
softmax weights in their attention, Sleef exp), the comparisons allow that rounding and no more.
"""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference.dsv4_layout import read_ds_mla, read_indexer


def _vllm_v4_ops_loadable() -> bool:
    if not torch.cpu._is_avx512_bf16_supported():
        return False
    import vllm._C  # noqa: F401  (registers torch.ops._C.*_cpu)

    return hasattr(torch.ops._C, "flash_mla_with_kvcache_cpu")


pytestmark = pytest.mark.skipif(not _vllm_v4_ops_loadable(),
                                reason="vLLM's DeepSeek V4 CPU ops need its AVX512-BF16 build (this CPU lacks it)")

NOPE, ROPE, D = 448, 64, 512
RECORD = NOPE + 2 * ROPE + NOPE // 64 + 1  # 584 bytes per fp8_ds_mla token


def _vllm():
    from vllm import _custom_ops

    return _custom_ops


def _rope_cache(max_pos: int) -> torch.Tensor:
    inv = 10000.0 ** (-torch.arange(0, ROPE, 2, dtype=torch.float64) / ROPE)
    angles = torch.arange(max_pos, dtype=torch.float64).unsqueeze(1) * inv
    return torch.cat((angles.cos(), angles.sin()), dim=1).float().contiguous()


def _pooled(rows: int, width: int, pad: int = 64) -> torch.Tensor:
    return torch.zeros(rows, width + pad, dtype=torch.uint8)[:, :width]


def _agree(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a == b).float().mean())


def _swa_insert(gen, t: int, bs: int, cache: torch.Tensor):
    q = torch.randn(t, 8, D, generator=gen).bfloat16()
    kv = (torch.randn(t, D, generator=gen) * 2).bfloat16()
    positions = torch.randint(0, 64, (t,), generator=gen)
    slots = torch.randperm(cache.shape[0] * bs, generator=gen)[:t]
    slots[1] = -1
    return q, kv, positions, slots


def test_qnorm_rope_kv_insert_matches_vllm():
    gen = torch.Generator().manual_seed(0)
    bs = 4
    ours_cache, vllm_cache = _pooled(4, bs * RECORD), _pooled(4, bs * RECORD)
    q, kv, positions, slots = _swa_insert(gen, 9, bs, ours_cache)
    cos_sin = _rope_cache(64)
    ours = ops.dsv4_qnorm_rope_kv_insert(q, kv, positions, ours_cache, slots, cos_sin, 10, 1e-6, bs)
    theirs = _vllm().fused_qnorm_rope_kv_insert_cpu(q, kv, positions, vllm_cache, slots, cos_sin, 10, 1e-6, bs)
    assert ours.shape == theirs.shape == (9, 10, D)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2**-7, atol=1e-3)
    valid = slots[slots >= 0]
    ours_rec, vllm_rec = read_ds_mla(ours_cache, bs, valid, NOPE), read_ds_mla(vllm_cache, bs, valid, NOPE)
    # nope dims are not rotated: bytes and scales identical; rope differs at most by one bf16 rounding
    assert torch.equal(ours_rec[:, :NOPE], vllm_rec[:, :NOPE])
    torch.testing.assert_close(ours_rec[:, NOPE:], vllm_rec[:, NOPE:], rtol=2**-7, atol=1e-6)
    # float32 activations (which vLLM's op refuses) give the same cache bytes for bf16-valued inputs
    f32_cache = _pooled(4, bs * RECORD)
    ops.dsv4_qnorm_rope_kv_insert(q.float(), kv.float(), positions, f32_cache, slots, cos_sin, 10, 1e-6, bs)
    assert torch.equal(f32_cache, ours_cache)


def test_save_partial_states_matches_vllm():
    gen = torch.Generator().manual_seed(1)
    t, width = 7, 1024
    kv_score = torch.randn(t, 2 * width, generator=gen)
    kv, score = kv_score[:, :width], kv_score[:, width:]
    ape = torch.randn(4, width, generator=gen)
    positions = torch.randint(0, 100, (t,), generator=gen)
    slots = torch.tensor([0, 5, -1, 9, 2, 14, 3])
    ours, theirs = torch.zeros(4, 4, 2 * width), torch.zeros(4, 4, 2 * width)
    ops.dsv4_save_partial_states(kv, score, ape, positions, ours, slots)
    _vllm().save_partial_states_cpu(kv, score, ape, positions, theirs, slots)
    assert torch.equal(ours, theirs)


def _compressor_case(gen, head_dim: int, ratio: int = 4):
    width = 2 * head_dim
    state = torch.randn(8, 4, 2 * width, generator=gen)
    t = 12
    positions = torch.arange(t) * 2 + 1  # every other token closes a block of 4
    gather = torch.randint(0, 32, (t, 2 * ratio), generator=gen)
    gather[0, :ratio] = -1
    kv_slots = torch.randperm(16, generator=gen)[:t]
    kv_slots[3] = -1
    weight = (torch.rand(head_dim, generator=gen) + 0.5).contiguous()
    return state, gather, positions, kv_slots, weight


def test_compress_norm_rope_store_matches_vllm():
    gen = torch.Generator().manual_seed(2)
    state, gather, positions, kv_slots, weight = _compressor_case(gen, D)
    ours, theirs = _pooled(8, 2 * RECORD), _pooled(8, 2 * RECORD)
    args = (state, gather, positions, kv_slots, weight, 1e-6, _rope_cache(64))
    ops.dsv4_compress_norm_rope_store(*args, ours, 2, 4)
    _vllm().compress_norm_rope_store_cpu(*args, theirs, 2, 4)
    written = kv_slots[((positions + 1) % 4 == 0) & (kv_slots >= 0)]
    assert written.numel() > 0
    a, b = read_ds_mla(ours, 2, written, NOPE), read_ds_mla(theirs, 2, written, NOPE)
    # softmax/exp rounding may move a rare value across a bf16 or fp8 rounding boundary: one fp8 ulp at most
    assert _agree(a, b) >= 0.99
    torch.testing.assert_close(a, b, rtol=2**-3, atol=2**-9)
    assert torch.equal(ours[~torch.isin(torch.arange(8), written // 2)], theirs[~torch.isin(torch.arange(8),
                                                                                           written // 2)])


def test_compress_norm_rope_store_indexer_matches_vllm():
    gen = torch.Generator().manual_seed(3)
    state, gather, positions, kv_slots, weight = _compressor_case(gen, 128)
    ours, theirs = _pooled(8, 2 * 132), _pooled(8, 2 * 132)
    args = (state, gather, positions, kv_slots, weight, 1e-6, _rope_cache(64))
    ops.dsv4_compress_norm_rope_store_indexer(*args, ours, 2, 4)
    _vllm().compress_norm_rope_store_indexer_cpu(*args, theirs, 2, 4)
    written = kv_slots[((positions + 1) % 4 == 0) & (kv_slots >= 0)]
    (av, asc), (bv, bsc) = read_indexer(ours, 2, written, 128), read_indexer(theirs, 2, written, 128)
    assert _agree(asc, bsc) >= 0.9 and _agree(av, bv) >= 0.99
    torch.testing.assert_close(av * asc.unsqueeze(1), bv * bsc.unsqueeze(1), rtol=2**-3, atol=1e-4)


def test_indexer_q_rope_quant_matches_vllm():
    gen = torch.Generator().manual_seed(4)
    t, heads = 6, 64
    q = torch.randn(t, heads, 128, generator=gen) * 4
    positions = torch.randint(0, 64, (t,), generator=gen)
    w = torch.randn(t, heads, generator=gen)
    outs = []
    for fn in (ops.dsv4_indexer_q_rope_quant, _vllm().fused_indexer_q_rope_quant_cpu):
        q_fp8, w_out = torch.empty(t, heads, 128, dtype=torch.float8_e4m3fn), torch.empty(t, heads)
        fn(positions, q, _rope_cache(64), q_fp8, w, 0.25, heads**-0.5, w_out)
        outs.append((q_fp8.view(torch.uint8), w_out))
    (a, aw), (b, bw) = outs
    torch.testing.assert_close(aw, bw, rtol=1e-6, atol=0)  # the same power-of-two scale per (token, head)
    assert torch.equal(a[..., :64], b[..., :64]) and _agree(a, b) >= 0.995


def test_fp8_paged_mqa_logits_matches_vllm():
    gen = torch.Generator().manual_seed(5)
    b, heads, bs, pages = 5, 64, 64, 12
    cache = _pooled(pages, bs * 132)
    values = torch.randint(0, 0x7F, (pages, bs * 128), generator=gen, dtype=torch.uint8)
    cache[:, : bs * 128] = values | (torch.rand(values.shape, generator=gen) < 0.5).to(torch.uint8) * 0x80
    scales = torch.exp2(torch.randint(-8, -2, (pages, bs), generator=gen).float())
    cache[:, bs * 128:] = scales.view(torch.uint8).view(pages, -1)
    q = (torch.randn(b, heads, 128, generator=gen) * 2).to(torch.float8_e4m3fn)
    weight = torch.randn(b, heads, generator=gen)
    seq_lens = torch.tensor([1, 64, 200, 0, 300], dtype=torch.int32)
    table = torch.randint(0, pages, (b, 5), generator=gen, dtype=torch.int32)
    ours = ops.dsv4_fp8_paged_mqa_logits(q, cache, weight, seq_lens, table, bs, 300)
    theirs = _vllm().fp8_paged_mqa_logits_cpu(q, cache, weight, seq_lens, table, bs, 300)
    valid = torch.arange(300).unsqueeze(0) < seq_lens.unsqueeze(1)
    torch.testing.assert_close(ours[valid], theirs[valid], rtol=1e-4, atol=1e-3)


def test_topk_transform_selects_the_same_512_as_vllm():
    gen = torch.Generator().manual_seed(6)
    b, length, page = 4, 1500, 64
    scores = torch.randn(b, length, generator=gen)
    seq_lens = torch.tensor([100, 512, 513, 1500], dtype=torch.int32)
    table = torch.randint(0, 100, (b, 24), generator=gen, dtype=torch.int32)
    results = []
    for fn in (ops.dsv4_topk_transform, _vllm().topk_transform_512_cpu):
        pages_out, raw = torch.empty(b, 512, dtype=torch.int32), torch.empty(b, 512, dtype=torch.int32)
        fn(scores, seq_lens, table, pages_out, page, raw)
        results.append((pages_out, raw))
    (ap, ar), (bp, br) = results
    # upstream leaves a long row in heap order: compare each row as a set
    assert torch.equal(ar.sort(1).values, br.sort(1).values) and torch.equal(ap.sort(1).values, bp.sort(1).values)


def test_sparse_mla_with_kvcache_matches_vllm():
    gen = torch.Generator().manual_seed(7)
    t, h, wbs, cbs = 6, 16, 4, 2
    window, compressed = _pooled(6, wbs * RECORD), _pooled(8, cbs * RECORD)
    for cache, bs in ((window, wbs), (compressed, cbs)):
        n = cache.shape[0] * bs
        kv = (torch.randn(n, D, generator=gen)).bfloat16()
        ops.dsv4_qnorm_rope_kv_insert(kv.unsqueeze(1), kv, torch.arange(n) % 64, cache, torch.arange(n),
                                      _rope_cache(64), 1, 1e-6, bs)
    q = (torch.randn(t, h, D, generator=gen) * 0.05).bfloat16()
    window_slots = torch.randint(-1, 24, (t, 8), generator=gen)
    window_slots[2] = -1
    compressed_slots = torch.randint(-1, 16, (t, 6), generator=gen)
    compressed_slots[2] = -1
    sink = torch.randn(h, generator=gen)
    ours, theirs = torch.empty(t, h, D, dtype=torch.bfloat16), torch.empty(t, h, D, dtype=torch.bfloat16)
    args = (window, window_slots, wbs, compressed, compressed_slots, cbs, sink, D**-0.5)
    ops.dsv4_sparse_mla_with_kvcache(ours, q, *args)
    _vllm().flash_mla_with_kvcache_cpu(theirs, q, *args)
    assert torch.all(theirs[2] == 0) and torch.all(ours[2] == 0)
    # upstream rounds the softmax weights to bf16 before weighting the values
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2e-2, atol=2e-2)
    f32 = torch.empty(t, h, D)
    ops.dsv4_sparse_mla_with_kvcache(f32, q.float(), *args)
    torch.testing.assert_close(f32, theirs.float(), rtol=2e-2, atol=2e-2)


def test_inverse_rope_o_proj_matches_vllm():
    gen = torch.Generator().manual_seed(8)
    o = torch.randn(5, 16, D, generator=gen).bfloat16()
    positions = torch.randint(0, 64, (5,), generator=gen)
    ours = ops.dsv4_inverse_rope_o_proj(o, positions, _rope_cache(64), ROPE)
    theirs = _vllm().inverse_gptj_rope_o_proj_cpu(o, positions, _rope_cache(64), ROPE)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
