"""The SFA ops (fp8 group quantization, the indexer cache and its top-k, sparse MLA) against naive float64 loops."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

D, SCALES = 128, 1  # indexer head_dim and its float32 scales per state


def _indexer_caches(nb: int, bs: int):
    """Keys and scales as views of one byte page per state (head_dim fp8 bytes, then the scales), as vLLM sizes it."""
    raw = torch.zeros(nb, bs, D + 4 * SCALES, dtype=torch.uint8)
    return raw[..., :D].view(torch.float8_e4m3fn).unsqueeze(2), raw[..., D:].view(torch.float32).unsqueeze(2)


def test_quantize_fp8_groups_rounds_to_nearest_with_power_of_two_scales():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 5, 2 * D, generator=gen) * 7
    x[0, 0, :D] = 0  # an all-zero group: scale from the eps floor, values 0
    values, scales = ops.quantize_fp8_groups(x, group_size=D)
    assert values.dtype == torch.float8_e4m3fn and values.shape == x.shape and scales.shape == (3, 5, 2)
    groups = x.double().unflatten(-1, (2, D))
    amax = groups.abs().amax(-1).clamp_min(1e-10)
    expected_scales = torch.exp2(torch.ceil(torch.log2(amax / 448)))
    torch.testing.assert_close(scales.double(), expected_scales)
    assert torch.equal(torch.log2(scales), torch.log2(scales).round())  # powers of two
    scaled = groups / expected_scales.unsqueeze(-1)
    # round to nearest float8: no representable value lies strictly closer to the input than the chosen one
    got = values.double().unflatten(-1, (2, D))
    grid = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    grid = grid[torch.isfinite(grid)]
    best = (scaled.unsqueeze(-1) - grid).abs().min(-1).values
    assert torch.all((scaled - got).abs() <= best + 1e-12)
    assert torch.all(values[0, 0, :D].double() == 0)
    _, plain = ops.quantize_fp8_groups(x, group_size=D, pow2_scales=False)
    torch.testing.assert_close(plain.double(), amax / 448)


def test_indexer_cache_write_stores_quantized_keys_by_slot_and_skips_padding():
    keys, scales = _indexer_caches(4, 16)
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(3, D, generator=gen)
    ops.indexer_cache_write(k, keys, scales, torch.tensor([17, -1, 63]))
    values, expected_scales = ops.quantize_fp8_groups(k, group_size=D)
    for row, slot in ((0, 17), (2, 63)):
        assert torch.equal(keys[slot // 16, slot % 16, 0].view(torch.uint8), values[row].view(torch.uint8))
        assert torch.equal(scales[slot // 16, slot % 16, 0], expected_scales[row])
    written = (keys.view(torch.uint8) != 0).any(-1).flatten().nonzero().flatten().tolist()
    assert written == [17, 63]


def _naive_scores(q, w, k_deq, seq_len, m):
    """Each of the request's m queries: {visible position: score} (a query at position p sees keys j <= p)."""
    return [{j: float(sum(w[i, h] * torch.relu(q[i, h] @ k_deq[j]) for h in range(q.shape[1])))
             for j in range(seq_len - m + i + 1)} for i in range(m)]


@pytest.mark.parametrize("topk", [4, 64])  # drops keys / keeps every visible key
def test_indexer_topk_picks_the_best_visible_positions_per_query(topk):
    gen = torch.Generator().manual_seed(2)
    bs, nb = 16, 10
    keys, scales = _indexer_caches(nb, bs)
    seq_lens, q_lens = [20, 5, 33], [20, 1, 3]  # a whole prefill, a decode, a chunk continuing a context
    table = torch.randperm(nb, generator=gen)[:9].view(3, 3).int()
    k_all = []
    for r, n in enumerate(seq_lens):
        k = torch.randn(n, D, generator=gen)
        slots = torch.tensor([int(table[r, j // bs]) * bs + j % bs for j in range(n)])
        ops.indexer_cache_write(k, keys, scales, slots)
        v, s = ops.quantize_fp8_groups(k, group_size=D)
        k_all.append(v.double() * s.double().repeat_interleave(D, -1))
    t, heads = sum(q_lens), 2
    q = torch.randn(t, heads, D, generator=gen).to(torch.float8_e4m3fn)
    w = torch.randn(t, heads, generator=gen)
    qsl = torch.tensor([0, 20, 21, 24], dtype=torch.int32)
    out = ops.indexer_topk(q, w, keys, scales, table, qsl, torch.tensor(seq_lens, dtype=torch.int32), topk=topk)
    assert out.shape == (t, topk) and out.dtype == torch.int32
    for r, (n, m) in enumerate(zip(seq_lens, q_lens, strict=True)):
        rows = out[int(qsl[r]):int(qsl[r + 1])]
        scores = _naive_scores(q[int(qsl[r]):int(qsl[r + 1])].double(), w[int(qsl[r]):int(qsl[r + 1])].double(),
                               k_all[r], n, m)
        for i, row in enumerate(rows.tolist()):
            picked = [j for j in row if j >= 0]
            assert len(set(picked)) == len(picked) == min(topk, len(scores[i]))
            assert picked == sorted(picked, reverse=True) and row[len(picked):] == [-1] * (topk - len(picked))
            # the best scores (any of tied positions will do): the k-th best is no worse than any left out
            best = sorted(scores[i].values(), reverse=True)[:len(picked)]
            torch.testing.assert_close(sorted((scores[i][j] for j in picked), reverse=True), best,
                                       rtol=1e-4, atol=1e-4)


def test_sparse_mla_attention_attends_only_to_the_selected_positions():
    gen = torch.Generator().manual_seed(3)
    heads, rank, rope_dim, bs, nb = 4, 32, 8, 16, 8
    backing = torch.randn(nb, bs, rank + rope_dim, generator=gen)
    latent_cache, rope_cache = backing[..., :rank].unsqueeze(2), backing[..., rank:].unsqueeze(2)
    table = torch.tensor([[3, 5, 0], [7, 1, 2]], dtype=torch.int32)
    qsl = torch.tensor([0, 2, 3], dtype=torch.int32)
    positions = torch.tensor([[40, 3, 17, -1], [0, -1, -1, -1], [-1, -1, -1, -1], [9, 9, 9, 9]], dtype=torch.int32)
    q_nope = torch.randn(4, heads, rank, generator=gen)  # row 3 is padding (past query_start_loc[-1])
    q_rope = torch.randn(4, heads, rope_dim, generator=gen)
    out = ops.sparse_mla_attention(q_nope, q_rope, latent_cache, rope_cache, table, qsl, positions, scale=0.2)
    assert out.shape == (4, heads, rank)
    for t, req in ((0, 0), (1, 0), (2, 1)):
        picked = [j for j in positions[t].tolist() if j >= 0]
        if not picked:
            assert torch.all(out[t] == 0)  # selected nothing
            continue
        lat = torch.stack([latent_cache[table[req, j // bs], j % bs, 0] for j in picked]).double()
        rope = torch.stack([rope_cache[table[req, j // bs], j % bs, 0] for j in picked]).double()
        for h in range(heads):
            weights = torch.softmax(0.2 * (lat @ q_nope[t, h].double() + rope @ q_rope[t, h].double()), dim=0)
            torch.testing.assert_close(out[t, h].double(), weights @ lat, rtol=1e-5, atol=1e-6)
    assert torch.all(out[3] == 0)


@pytest.mark.parametrize(("call", "argument"), [
    (lambda: ops.quantize_fp8_groups(torch.zeros(2, 100), group_size=128), "group_size"),
    (lambda: ops.indexer_cache_write(torch.zeros(2, 100), *_indexer_caches(2, 16), torch.zeros(2, dtype=torch.long)),
     "'k'"),
    (lambda: ops.indexer_topk(torch.zeros(2, 2, D), torch.zeros(2, 3), *_indexer_caches(2, 16),
                              torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0, 2]), torch.tensor([2]), topk=4),
     "'weights'"),
    (lambda: ops.sparse_mla_attention(torch.zeros(2, 4, 32), torch.zeros(2, 4, 8), torch.zeros(2, 16, 1, 16),
                                      torch.zeros(2, 16, 1, 8), torch.zeros(1, 2, dtype=torch.int32),
                                      torch.tensor([0, 2]), torch.zeros(2, 4, dtype=torch.int32), scale=1.0),
     "'latent_cache'"),
])
def test_sfa_ops_name_the_bad_argument(call, argument):
    with pytest.raises(ValueError, match=argument):
        call()
