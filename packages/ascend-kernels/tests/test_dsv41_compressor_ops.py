"""DeepSeek V4.1's compressor ops (`dsv41_save_compress_norm`, `dsv41_rope_quant_insert`,
`dsv41_indexer_k_norm_rope_store`) against float64 loops and vLLM's own Triton kernels (interpreted on the CPU)."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

D, ROPE, DK = 512, 64, 128
EPS = 1e-6
# a float32 latent and its float64 formulation may round to neighbouring bf16 values at a tie: one unit apart
BF16_ULP = dict(rtol=2.0**-7, atol=1e-6)
FCQC = "models/deepseek_v41/common/ops/fused_compress_quant_cache.py"


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).double()


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float = EPS) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt(x.square().mean() + eps) * w.double()


class _Stream:
    """Requests fed chunk by chunk: the float64 history the ring must reproduce, and the batch tensors of a step."""

    def __init__(self, num_reqs: int, capacity: int, gen: torch.Generator, ratio: int):
        self.capacity, self.gen, self.ratio = capacity, gen, ratio
        self.history = [[] for _ in range(num_reqs)]
        self.state = torch.full((num_reqs + 1, capacity, 2 * D), float("nan"))  # block r+1 belongs to request r

    def step(self, chunks: list[tuple[int, int]]):
        """chunks: (request, length). Returns (kv_score, positions, slots, qsl, req_ids)."""
        rows, pos, slots, qsl, req_ids = [], [], [], [0], []
        for r, length in chunks:
            start = len(self.history[r])
            x = torch.randn(length, self.ratio * D, generator=self.gen)
            self.history[r].extend(x)
            rows.append(x)
            p = torch.arange(start, start + length)
            pos.append(p)
            slots.append((r + 1) * self.capacity + p % self.capacity)
            req_ids.append(torch.full((length,), len(qsl) - 1))
            qsl.append(qsl[-1] + length)
        return (torch.cat(rows), torch.cat(pos), torch.cat(slots), torch.tensor(qsl), torch.cat(req_ids))


def _naive_ratio2_latent(history, p, w):
    prev, cur = history[p - 1].double(), history[p].double()
    kv, score = torch.stack((prev[:D], cur[:D])), torch.stack((prev[D:], cur[D:]))
    weights = torch.exp(score - score.max(0).values) / torch.exp(score - score.max(0).values).sum(0)
    return _bf16(_norm((kv * weights).sum(0), w))


def test_save_compress_norm_ratio2_pools_across_chunks_through_the_ring():
    gen = torch.Generator().manual_seed(0)
    w = torch.rand(D, generator=gen) + 0.5
    stream = _Stream(2, 8, gen, ratio=2)
    # chunk boundaries at even and odd positions, a chunk longer than the ring, a single-token decode step
    for chunks in ([(0, 3), (1, 4)], [(0, 1), (1, 11)], [(0, 5), (1, 1)], [(1, 2), (0, 1)]):
        kv_score, pos, slots, qsl, req_ids = stream.step(chunks)
        slots[-1] = -1 if chunks == [(1, 2), (0, 1)] else slots[-1]  # a token without a slot: no latent, no store
        latent = torch.full((kv_score.shape[0], D), 7.0)
        ops.dsv41_save_compress_norm(kv_score, pos, stream.state, slots, qsl, req_ids, w, EPS, 2, latent)
        t = 0
        for r, length in chunks:
            for _ in range(length):
                p = int(pos[t])
                if p % 2 == 1 and int(slots[t]) >= 0:
                    torch.testing.assert_close(latent[t].double(), _naive_ratio2_latent(stream.history[r], p, w),
                                               **BF16_ULP)
                else:
                    assert torch.all(latent[t] == 7.0), (chunks, t)
                t += 1
        # the ring holds each request's last `capacity` rows (only those of chunks whose first slot is valid)
        for r, _ in chunks:
            if chunks == [(1, 2), (0, 1)] and r == 0:
                continue
            h = stream.history[r]
            for p in range(max(0, len(h) - 8), len(h)):
                assert torch.equal(stream.state[r + 1, p % 8], h[p]), (r, p)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_save_compress_norm_ratio1_normalizes_each_valid_token(dtype):
    gen = torch.Generator().manual_seed(1)
    kv = torch.randn(6, D, generator=gen).to(dtype)
    w = torch.rand(D, generator=gen) + 0.5
    slots = torch.tensor([3, -1, 0, 9, 4])  # 5 of the 6 rows processed
    latent = torch.full((6, D), 7.0, dtype=dtype)
    ops.dsv41_save_compress_norm(kv, torch.arange(6), None, slots, None, None, w, EPS, 1, latent)
    for t in range(6):
        if t < 5 and int(slots[t]) >= 0:
            torch.testing.assert_close(latent[t].double(), _bf16(_norm(kv[t], w)), **BF16_ULP)
        else:
            assert torch.all(latent[t] == 7.0)


def _latents(gen, n=6):
    return torch.randn(n, D, generator=gen).to(torch.bfloat16).float() * 3


def _naive_rotated(latent_row, p, ratio, rope_cache, dsv4_naive):
    g = p // ratio * ratio
    c, s = rope_cache[g, :ROPE // 2].double(), rope_cache[g, ROPE // 2:].double()
    x = latent_row.double()
    return torch.cat((x[:-ROPE], dsv4_naive.gptj(x[-ROPE:], c, s)))


@pytest.mark.parametrize("ratio", [1, 2])
@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_rope_quant_insert_plain_rows(ratio, cache_dtype, dsv4_naive):
    gen = torch.Generator().manual_seed(2)
    latent = _latents(gen)
    pos = torch.tensor([4, 5, 6, 7, 8, 9])
    slots = torch.tensor([0, 1, 5, -1, 2, 3])
    rope_cache = dsv4_naive.rope_cache(64, ROPE)
    cache = torch.full((3, 4, D), 7.0, dtype=cache_dtype)
    ops.dsv41_rope_quant_insert(latent, pos, rope_cache, cache, slots, ratio)
    written = set()
    for t in range(6):
        p, s = int(pos[t]), int(slots[t])
        if s >= 0 and (p + 1) % ratio == 0:
            want = _naive_rotated(latent[t], p, ratio, rope_cache, dsv4_naive).to(cache_dtype).double()
            torch.testing.assert_close(cache[s // 4, s % 4].double(), want, rtol=1e-6, atol=1e-6)
            written.add(s)
    for s in range(12):
        if s not in written:
            assert torch.all(cache[s // 4, s % 4] == 7.0)
    assert written == ({0, 1, 5, 2, 3} if ratio == 1 else {1, 3})


def test_rope_quant_insert_fp8_rows_and_mxfp8_records(dsv4_naive):
    gen = torch.Generator().manual_seed(3)
    latent = _latents(gen, 4)
    pos, slots = torch.tensor([1, 3, 5, 7]), torch.tensor([6, 0, 3, 4])
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    rows = [_naive_rotated(latent[t], int(pos[t]), 2, rope_cache, dsv4_naive) for t in range(4)]
    # per-tensor fp8 rows: the bf16 row / scale
    scale = torch.tensor([0.5])
    fp8 = torch.zeros(2, 4, D, dtype=torch.float8_e4m3fn)
    ops.dsv41_rope_quant_insert(latent, pos, rope_cache, fp8, slots, 2, fp8_scale=scale)
    for t, s in enumerate(slots.tolist()):
        want = dsv4_naive.fp8_bytes((_bf16(rows[t]) / 0.5).clamp(-448, 448), flush=False)
        assert torch.equal(fp8[s // 4, s % 4].view(torch.uint8), want)
    # MXFP8 pages: [4 x 512 fp8 values | 4 x 16 UE8M0 exponents]
    mx = torch.zeros(2, 4, 528, dtype=torch.uint8)
    ops.dsv41_rope_quant_insert(latent, pos, rope_cache, mx, slots, 2)
    for t, s in enumerate(slots.tolist()):
        page = mx[s // 4].flatten()
        values, exps = page[(s % 4) * 512:(s % 4 + 1) * 512], page[2048 + (s % 4) * 16: 2048 + (s % 4 + 1) * 16]
        tiles = rows[t].view(16, 32)
        want_e = [dsv4_naive.pow2_exponent(max(float(tile.abs().max()), 1e-4) / 448) for tile in tiles]
        assert exps.tolist() == [e + 127 for e in want_e]
        scaled = (tiles / torch.tensor([2.0 ** e for e in want_e], dtype=torch.float64).unsqueeze(1)).clamp(-448, 448)
        assert torch.equal(values, dsv4_naive.fp8_bytes(scaled.flatten(), flush=False))


def test_rope_quant_insert_ds_mla_records(dsv4_naive):
    gen = torch.Generator().manual_seed(4)
    latent = _latents(gen, 3)
    pos, slots = torch.tensor([0, 1, 2]), torch.tensor([5, -1, 6])
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    cache = torch.zeros(2, 4, 584, dtype=torch.uint8)
    ops.dsv41_rope_quant_insert(latent, pos, rope_cache, cache, slots, 1)
    for t in (0, 2):
        s = int(slots[t])
        row = _naive_rotated(latent[t], int(pos[t]), 1, rope_cache, dsv4_naive)
        nope_bytes, exps, pad, rope_values, _ = dsv4_naive.ds_mla_record(cache.view(2, -1), 4, s, 448)
        want_e = [dsv4_naive.pow2_exponent(max(float(tile.abs().max()), 1e-4) / 448) for tile in row[:448].view(7, 64)]
        assert exps.tolist() == [e + 127 for e in want_e] and pad == 0
        scaled = (row[:448].view(7, 64) / torch.tensor([2.0 ** e for e in want_e], dtype=torch.float64).unsqueeze(1))
        assert torch.equal(nope_bytes, dsv4_naive.fp8_bytes(scaled.clamp(-448, 448).flatten(), flush=False))
        assert torch.equal(rope_values, _bf16(row[448:]))
    assert torch.all(cache[0] == 0)  # slot -1 wrote nothing; block 0 holds no slot


@pytest.mark.parametrize("ratio", [1, 2])
def test_indexer_k_norm_rope_store_matches_naive_and_feeds_paged_mqa_logits(ratio, dsv4_naive):
    gen = torch.Generator().manual_seed(5)
    k_pre = torch.randn(5, DK, generator=gen)
    w = torch.rand(DK, generator=gen) + 0.5
    pos, slots = torch.tensor([2, 3, 4, 5, 6]), torch.tensor([1, 2, -1, 7, 4])
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    cache = torch.zeros(2, 4, DK + 4, dtype=torch.uint8)
    ops.dsv41_indexer_k_norm_rope_store(k_pre, pos, rope_cache, w, EPS, cache, slots, ratio, False)
    written = []
    for t in range(5):
        p, s = int(pos[t]), int(slots[t])
        if s < 0 or (p + 1) % ratio:
            continue
        written.append(s)
        g = p // ratio * ratio
        x = _bf16(_norm(k_pre[t], w))
        c, sn = rope_cache[g, :32].double(), rope_cache[g, 32:].double()
        row = _bf16(torch.cat((x[:-ROPE], dsv4_naive.gptj(x[-ROPE:], c, sn))))
        e = dsv4_naive.pow2_exponent(max(float(row.abs().max()), 1e-4) / 448)
        values, scale = dsv4_naive.indexer_record(cache.view(2, -1), 4, s, DK)
        assert scale == 2.0 ** e
        assert torch.equal(values, dsv4_naive.fp8_bytes((row / 2.0 ** e).clamp(-448, 448), flush=False))
    assert sorted(written) == ([1, 2, 4, 7] if ratio == 1 else [2, 7])
    # the cache reads back through V4's paged MQA logits (one query row against the written entries)
    q = torch.randn(1, 2, DK, generator=gen)
    page_table = torch.tensor([[0, 1]])
    logits = ops.dsv4_fp8_paged_mqa_logits(q, cache.view(2, -1), torch.ones(1, 2), torch.tensor([8]), page_table, 4, 8)
    assert torch.isfinite(logits[0, written]).all()


def test_compressor_validation_names_the_argument():
    w = torch.ones(D)
    with pytest.raises(ValueError, match="dsv41_save_compress_norm: argument 'compress_ratio'"):
        ops.dsv41_save_compress_norm(torch.zeros(2, D), torch.arange(2), None, torch.arange(2), None, None, w, EPS,
                                     4, torch.zeros(2, D))
    with pytest.raises(ValueError, match="argument 'state_cache'"):
        ops.dsv41_save_compress_norm(torch.zeros(2, 2 * D), torch.arange(2), torch.zeros(1, 8, D), torch.arange(2),
                                     torch.tensor([0, 2]), torch.zeros(2, dtype=torch.long), w, EPS, 2,
                                     torch.zeros(2, D))
    with pytest.raises(ValueError, match="dsv41_rope_quant_insert: argument 'kv_cache'"):
        ops.dsv41_rope_quant_insert(torch.zeros(2, D), torch.arange(2), torch.zeros(8, ROPE),
                                    torch.zeros(2, 4, 600, dtype=torch.uint8), torch.arange(2), 1)
    with pytest.raises(ValueError, match="argument 'fp8_scale'"):
        ops.dsv41_rope_quant_insert(torch.zeros(2, D), torch.arange(2), torch.zeros(8, ROPE),
                                    torch.zeros(2, 4, D, dtype=torch.float8_e4m3fn), torch.arange(2), 1)
    with pytest.raises(ValueError, match="dsv41_indexer_k_norm_rope_store: argument 'use_fp4_cache'"):
        ops.dsv41_indexer_k_norm_rope_store(torch.zeros(2, DK), torch.arange(2), torch.zeros(8, ROPE),
                                            torch.ones(DK), EPS, torch.zeros(2, 4, DK + 4, dtype=torch.uint8),
                                            torch.arange(2), 1, True)


# ----------------------------------------------------------------------- anchors: vLLM's Triton kernels, interpreted


def _fcqc(vllm_triton):
    return vllm_triton.load(FCQC, {**vllm_triton.TRITON_IMPORTS, **vllm_triton.NO_GPU_PLATFORM,
                                   "from vllm.models.deepseek_v4.common.ops.fused_indexer_q import _fp32x2_to_fp4x2":
                                   "_fp32x2_to_fp4x2 = None  # the NVFP4 insert only"})


def _fp8_close(got_bytes: torch.Tensor, want_bytes: torch.Tensor) -> None:
    """Our fp8 bytes against the interpreted kernel's: equal, but for the odd neighbour on the e4m3 grid (float32
    arithmetic in another order may round the other way at a boundary)."""
    got = got_bytes.view(torch.float8_e4m3fn).double()
    want = want_bytes.view(torch.float8_e4m3fn).double()
    torch.testing.assert_close(got, want, rtol=2.0**-3, atol=2.0**-9)
    assert int((got != want).sum()) <= max(2, got.numel() // 100), int((got != want).sum())


def test_save_compress_norm_matches_vllm_triton_kernel(vllm_triton):
    fcqc = _fcqc(vllm_triton)
    gen = torch.Generator().manual_seed(6)
    w = (torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16)
    ours = _Stream(2, 8, gen, ratio=2)
    theirs_state = ours.state.clone()
    for chunks in ([(0, 3), (1, 4)], [(0, 1), (1, 11)], [(1, 1), (0, 2)]):
        kv_score, pos, slots, qsl, req_ids = ours.step(chunks)
        latent = torch.zeros(kv_score.shape[0], D)
        ops.dsv41_save_compress_norm(kv_score, pos, ours.state, slots, qsl, req_ids, w, EPS, 2, latent)
        want = torch.zeros(kv_score.shape[0], D, dtype=torch.bfloat16)
        fcqc.fused_save_compress_norm(kv_score, pos, theirs_state, slots, qsl.int(), req_ids.int(), w, EPS, 2, want)
        torch.testing.assert_close(latent, want.float(), **BF16_ULP)
        assert torch.equal(ours.state.nan_to_num(), theirs_state.nan_to_num())
    kv = torch.randn(5, D, generator=gen)
    latent, want = torch.zeros(5, D), torch.zeros(5, D, dtype=torch.bfloat16)
    slots = torch.tensor([0, -1, 3, 4, 2])
    ops.dsv41_save_compress_norm(kv, torch.arange(5), None, slots, None, None, w, EPS, 1, latent)
    fcqc.fused_save_compress_norm(kv, torch.arange(5), None, slots, None, None, w, EPS, 1, want)
    torch.testing.assert_close(latent, want.float(), **BF16_ULP)


@pytest.mark.parametrize("layout", ["bf16", "mxfp8", "ds_mla"])
def test_rope_quant_insert_matches_vllm_triton_kernel(layout, vllm_triton, dsv4_naive):
    fcqc = _fcqc(vllm_triton)
    gen = torch.Generator().manual_seed(7)
    latent = _latents(gen, 6).to(torch.bfloat16)
    pos, slots = torch.tensor([2, 3, 4, 5, 6, 7]), torch.tensor([0, 5, 1, 6, -1, 3])
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    if layout == "bf16":
        ours, theirs = (torch.zeros(2, 4, D, dtype=torch.bfloat16) for _ in range(2))
    else:
        ours, theirs = (torch.zeros(2, 4, 528 if layout == "mxfp8" else 584, dtype=torch.uint8) for _ in range(2))
    ops.dsv41_rope_quant_insert(latent, pos, rope_cache, ours, slots, 2)
    fcqc.rope_quant_insert(latent, pos, rope_cache, theirs, slots, 2)
    if layout == "bf16":
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2.0**-7, atol=1e-6)
        return
    values = 4 * (512 if layout == "mxfp8" else 576)
    if layout == "ds_mla":  # 448 fp8 bytes then 64 bf16 rope values per record
        o, t = ours.view(2, -1)[:, :values].reshape(2, 4, 576), theirs.view(2, -1)[:, :values].reshape(2, 4, 576)
        _fp8_close(o[..., :448], t[..., :448])
        torch.testing.assert_close(o[..., 448:].contiguous().view(torch.bfloat16).float(),
                                   t[..., 448:].contiguous().view(torch.bfloat16).float(), rtol=2.0**-7, atol=1e-6)
    else:
        _fp8_close(ours.view(2, -1)[:, :values], theirs.view(2, -1)[:, :values])
    assert torch.equal(ours.view(2, -1)[:, values:], theirs.view(2, -1)[:, values:])  # the UE8M0 exponents


def test_indexer_k_norm_rope_store_matches_vllm_triton_kernel(vllm_triton, dsv4_naive):
    store = vllm_triton.load("models/deepseek_v41/common/ops/indexer_k_store.py", {
        **vllm_triton.TRITON_IMPORTS, **vllm_triton.NO_GPU_PLATFORM,
        "from . import MXFP4_BLOCK_SIZE, _fp32x2_to_fp4x2": "MXFP4_BLOCK_SIZE, _fp32x2_to_fp4x2 = 32, None"})
    gen = torch.Generator().manual_seed(8)
    k_pre = torch.randn(6, DK, generator=gen).to(torch.bfloat16)
    w = (torch.rand(DK, generator=gen) + 0.5).to(torch.bfloat16)
    pos, slots = torch.tensor([2, 3, 4, 5, 6, 7]), torch.tensor([0, 5, 1, 6, -1, 3])
    rope_cache = dsv4_naive.rope_cache(16, ROPE)
    for ratio in (1, 2):
        ours, theirs = (torch.zeros(2, 4, DK + 4, dtype=torch.uint8) for _ in range(2))
        ops.dsv41_indexer_k_norm_rope_store(k_pre, pos, rope_cache, w, EPS, ours, slots, ratio, False)
        store.indexer_k_norm_rope_store(k_pre, pos, rope_cache, w, EPS, theirs, slots, ratio, False)
        _fp8_close(ours.view(2, -1)[:, :4 * DK], theirs.view(2, -1)[:, :4 * DK])
        assert torch.equal(ours.view(2, -1)[:, 4 * DK:], theirs.view(2, -1)[:, 4 * DK:])  # float32 scales
