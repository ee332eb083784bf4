"""DeepSeek V4's sparse-indexer ops (query RoPE + fp8 quantization, paged logits over the indexer K cache, top-k)
against naive float64 loops."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

ROPE = 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads", [1, 6])
def test_indexer_q_rope_quant_rotates_quantizes_and_folds_the_scale_into_the_weights(dtype, heads, dsv4_naive):
    gen = torch.Generator().manual_seed(0)
    t, d = 4, 128
    nope = d - ROPE
    q = (torch.randn(t, heads, d, generator=gen) * 5).to(dtype)
    q[0, 0, :nope] = 0  # a head whose amax comes from its rope dims only
    positions = torch.tensor([3, 0, 17, 8])
    cos_sin_cache = dsv4_naive.rope_cache(20, ROPE)
    weights = torch.randn(t, heads, generator=gen).to(dtype)
    q_fp8 = torch.empty(t, heads, d, dtype=torch.float8_e4m3fn)
    weights_out = torch.empty(t, heads)
    ops.dsv4_indexer_q_rope_quant(positions, q, cos_sin_cache, q_fp8, weights, 0.125, heads**-0.5, weights_out)

    cos, sin = cos_sin_cache[positions].double().chunk(2, dim=1)
    rope_agree = rope_total = 0
    for i in range(t):
        for h in range(heads):
            x = q[i, h].double()
            rope = dsv4_naive.gptj(x[nope:], cos[i], sin[i])
            row = torch.cat((x[:nope], rope.to(torch.bfloat16).double()))
            scale = 2.0 ** dsv4_naive.pow2_exponent(max(row.abs().max().item(), 1e-4) / 448)
            expected_w = float(weights[i, h]) * scale * 0.125 * heads**-0.5
            torch.testing.assert_close(float(weights_out[i, h]), expected_w, rtol=1e-6, atol=0)
            # the nope dims are not rotated: their bytes are exactly the nearest-even fp8 of x / scale
            got = q_fp8[i, h].view(torch.uint8)
            assert torch.equal(got[:nope], dsv4_naive.fp8_bytes(x[:nope] / scale, flush=False))
            deq = q_fp8[i, h].double() * scale
            torch.testing.assert_close(deq[nope:], rope, rtol=2**-4 + 2**-7, atol=scale * 2**-9)
            # the rotated dims are rounded through bf16 before quantization; float32 vs float64 rotation may move a
            # rare value across a bf16 midpoint, so compare the bytes as a share (skipping the bf16 step moves ~6%)
            rope_agree += int((got[nope:] == dsv4_naive.fp8_bytes(row[nope:] / scale, flush=False)).sum())
            rope_total += ROPE
    assert rope_agree >= 0.995 * rope_total


def test_indexer_q_rope_quant_processes_only_the_rows_positions_cover(dsv4_naive):
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(5, 2, 128, generator=gen)
    q_fp8 = torch.full((5, 2, 128), 3.0).to(torch.float8_e4m3fn)
    weights_out = torch.full((5, 2), 9.0)
    ops.dsv4_indexer_q_rope_quant(torch.tensor([0, 4, 2]), q, dsv4_naive.rope_cache(8, ROPE), q_fp8,
                                  torch.ones(5, 2), 1.0, 1.0, weights_out)
    assert torch.all(q_fp8[3:].float() == 3.0) and torch.all(weights_out[3:] == 9.0)
    assert torch.all(weights_out[:3] != 9.0)


def _indexer_cache(num_blocks: int, block_size: int, d: int, gen: torch.Generator, pad: int = 20) -> torch.Tensor:
    """An indexer K cache (fp8 records then float32 scales per block) as a pooled 2-D view, filled at random."""
    cache = torch.zeros(num_blocks, block_size * (d + 4) + pad, dtype=torch.uint8)[:, : block_size * (d + 4)]
    values = torch.randint(0, 0x7F, (num_blocks, block_size * d), generator=gen, dtype=torch.uint8)
    values |= (torch.rand(values.shape, generator=gen) < 0.5).to(torch.uint8) * 0x80
    cache[:, : block_size * d] = values
    scales = torch.exp2(torch.randint(-4, 3, (num_blocks, block_size), generator=gen).float())
    cache[:, block_size * d:] = scales.view(torch.uint8).view(num_blocks, -1)
    return cache


@pytest.mark.parametrize("page_dtype", [torch.int32, torch.int64])
def test_fp8_paged_mqa_logits_scores_each_visible_key_through_the_page_table(page_dtype, dsv4_naive):
    gen = torch.Generator().manual_seed(1)
    b, heads, d, bs = 3, 4, 128, 4
    cache = _indexer_cache(6, bs, d, gen)
    q = (torch.randn(b, heads, d, generator=gen) * 2).to(torch.float8_e4m3fn)
    weight = torch.randn(b, heads, generator=gen)
    seq_lens = torch.tensor([9, 0, 4], dtype=torch.int32)
    page_table = torch.tensor([[5, 0, 3], [1, 1, 1], [2, 4, 4]], dtype=page_dtype)
    logits = ops.dsv4_fp8_paged_mqa_logits(q, cache, weight, seq_lens, page_table, bs, 11)
    assert logits.shape == (b, 11) and logits.dtype == torch.float32
    for r in range(b):
        for j in range(11):
            if j >= int(seq_lens[r]):
                assert logits[r, j] == float("-inf")
                continue
            slot = int(page_table[r, j // bs]) * bs + j % bs
            values, scale = dsv4_naive.indexer_record(cache, bs, slot, d)
            k = values.view(torch.float8_e4m3fn).double()
            expected = scale * sum(float(weight[r, h]) * max(0.0, float(q[r, h].double() @ k))
                                   for h in range(heads))
            torch.testing.assert_close(float(logits[r, j]), expected, rtol=1e-5, atol=1e-4)


def _naive_topk(scores_row, seq_len: int, topk: int) -> list[int]:
    if seq_len <= topk:
        return list(range(seq_len))
    ranked = sorted(range(seq_len), key=lambda j: (-float(scores_row[j]), j))
    return sorted(ranked[:topk])


@pytest.mark.parametrize("topk", [1, 5, 512])
def test_topk_transform_picks_the_best_positions_and_maps_them_to_pages(topk):
    gen = torch.Generator().manual_seed(2)
    length, page = 700, 16
    scores = torch.randn(4, length, generator=gen)
    scores[2, :50] = 1.0  # ties: the lower positions win
    seq_lens = torch.tensor([0, 3, 700, 650])
    pages = torch.randperm(4 * 44, generator=gen)[: 4 * 44].view(4, 44).to(torch.int32)
    out_pages = torch.full((4, topk), 99, dtype=torch.int32)
    out_raw = torch.full((4, topk), 99, dtype=torch.int32)
    ops.dsv4_topk_transform(scores, seq_lens, pages, out_pages, page, out_raw)
    for r in range(4):
        expected = _naive_topk(scores[r], int(seq_lens[r]), topk)
        expected = expected + [-1] * (topk - len(expected))
        assert out_raw[r].tolist() == expected
        mapped = [int(pages[r, j // page]) * page + j % page if j >= 0 else -1 for j in expected]
        assert out_pages[r].tolist() == mapped


def test_topk_transform_writes_into_strided_rows_of_a_wider_buffer():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.7]])
    buffer = torch.full((1, 6), 42, dtype=torch.int32)
    out_pages = torch.empty(1, 2, dtype=torch.int32)
    ops.dsv4_topk_transform(scores, torch.tensor([4]), torch.tensor([[3, 1]]), out_pages, 2, buffer[:, :2])
    assert buffer.tolist() == [[1, 3, 42, 42, 42, 42]]
    assert out_pages.tolist() == [[7, 3]]  # position 1 -> page 3 offset 1, position 3 -> page 1 offset 1


def test_indexer_ops_name_the_bad_argument():
    with pytest.raises(ValueError, match="'kvcache_fp8'"):
        ops.dsv4_fp8_paged_mqa_logits(torch.zeros(1, 2, 128), torch.zeros(2, 10, dtype=torch.uint8),
                                      torch.zeros(1, 2), torch.ones(1, dtype=torch.int32),
                                      torch.zeros(1, 1, dtype=torch.int32), 4, 4)
    with pytest.raises(ValueError, match="'out_raw_indices'"):
        ops.dsv4_topk_transform(torch.zeros(2, 4), torch.ones(2, dtype=torch.int32),
                                torch.zeros(2, 1, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32), 4,
                                torch.zeros(2, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="'index_weights_out'"):
        ops.dsv4_indexer_q_rope_quant(torch.zeros(2, dtype=torch.long), torch.zeros(2, 3, 128),
                                      torch.zeros(4, 64), torch.zeros(2, 3, 128), torch.zeros(2, 3), 1.0, 1.0,
                                      torch.zeros(2, 4))
