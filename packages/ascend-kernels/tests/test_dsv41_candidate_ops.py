"""DeepSeek V4.1's candidate-block selection and masking against per-row Python loops and vLLM's own Triton kernels
(`candidate_blocks.py`, interpreted on the CPU)."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops

CANDIDATES = "model_executor/kernels/attention/dsa/candidate_blocks.py"


def _case(seed: int, rows: int = 6, width: int = 37, row_repeat: int = 1, starts: bool = True):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, width, generator=gen)
    logits[0, 3] = float("-inf")
    groups = -(-rows // row_repeat)
    ks = torch.randint(0, 8, (groups,), generator=gen, dtype=torch.int32) if starts else None
    lo = ks if ks is not None else torch.zeros(groups, dtype=torch.int32)
    ke = (lo + torch.randint(0, width, (groups,), generator=gen, dtype=torch.int32)).clamp(max=width + 3)
    ke[0] = lo[0]  # an empty row
    return logits, ks, ke


def _naive_select(logits, ks, ke, topk, bs, rr):
    rows, width = logits.shape
    nblocks = math.ceil(width / bs)
    out = []
    for i in range(rows):
        start = 0 if ks is None else int(ks[i // rr])
        end = int(ke[i // rr])
        scores = []
        for b in range(nblocks):
            cols = [c for c in range(start + b * bs, start + (b + 1) * bs) if c < end and c < width]
            score = max((float(logits[i, c]) for c in cols), default=float("-inf"))
            if end > start and b == (end - start - 1) // bs:
                score = float("inf")
            scores.append(score)
        order = sorted(range(nblocks), key=lambda b: (-scores[b], b))[: min(topk, nblocks)]
        row = [b if scores[b] != float("-inf") else -1 for b in order]
        out.append(row + [-1] * (topk - len(row)))
    return out


def _naive_mask(logits, ks, ke, cands, bs, rr):
    rows, width = logits.shape
    nblocks = math.ceil(width / bs)
    out = logits.clone()
    for i in range(rows):
        start = 0 if ks is None else int(ks[i // rr])
        end = int(ke[i // rr])
        listed = {int(b) for b in cands[i] if int(b) >= 0}
        edge = any(start + b * bs >= width for b in listed)
        for c in range(width):
            keep = start <= c < end and ((c - start) // bs in listed and start + (c - start) // bs * bs < width
                                         or (c == width - 1 and edge))
            if not keep:
                out[i, c] = float("-inf")
    del nblocks
    return out


@pytest.mark.parametrize("row_repeat,starts", [(1, True), (1, False), (2, False), (3, True)])
def test_select_candidate_blocks_matches_naive(row_repeat, starts):
    logits, ks, ke = _case(0, row_repeat=row_repeat, starts=starts)
    out = torch.full((6, 5), 99, dtype=torch.int32)
    ops.dsv41_select_candidate_blocks(logits, ks, ke, 4, 8, out, row_repeat)
    want = _naive_select(logits, ks, ke, 4, 8, row_repeat)
    for i in range(6):
        # equal scores (only -inf blocks here, all mapped to -1) make the order a set question
        assert out[i, :4].tolist() == want[i], (i, out[i].tolist(), want[i])
        assert int(out[i, 4]) == 99  # past topk_blocks: untouched
    assert out[0, :4].tolist() == [-1] * 4  # the empty row selects nothing


def test_select_candidate_blocks_pins_the_newest_block_and_propagates_nan():
    logits = torch.tensor([[5.0, 4.0, 0.1, 0.2, -3.0, -2.0], [1.0, float("nan"), 0.0, 0.0, -1.0, -1.0]])
    out = torch.empty(2, 2, dtype=torch.int64)
    ops.dsv41_select_candidate_blocks(logits, None, torch.tensor([6, 6]), 2, 2, out)
    assert out[0].tolist() == [2, 0]  # newest block (+inf) first, then the best
    assert set(out[1].tolist()) == {2, 0}  # NaN wins against finite scores (not -inf: kept)


@pytest.mark.parametrize("row_repeat,starts", [(1, True), (2, False)])
def test_apply_candidate_mask_matches_naive(row_repeat, starts):
    logits, ks, ke = _case(1, row_repeat=row_repeat, starts=starts)
    gen = torch.Generator().manual_seed(2)
    cands = torch.randint(-1, 6, (6, 3), generator=gen, dtype=torch.int32)
    cands[1, 0] = 9  # past the width: keeps the last column, in bounds here
    ke[1 // row_repeat] = 40
    want = _naive_mask(logits, ks, ke, cands, 8, row_repeat)
    got = logits.clone()
    ops.dsv41_apply_candidate_mask(got, ks, ke, cands, 8, row_repeat)
    assert torch.equal(got, want)
    assert torch.isinf(got).sum() > torch.isinf(logits).sum()


def test_select_then_mask_keeps_exactly_the_selected_blocks():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(3))
    ke = torch.tensor([40, 17, 33])
    cands = torch.empty(3, 2, dtype=torch.int32)
    ops.dsv41_select_candidate_blocks(logits, None, ke, 2, 8, cands)
    masked = logits.clone()
    ops.dsv41_apply_candidate_mask(masked, None, ke, cands, 8)
    for i in range(3):
        kept = {c // 8 for c in range(40) if masked[i, c] != float("-inf")}
        assert kept == set(cands[i].tolist()) and (int(ke[i]) - 1) // 8 in kept


def test_candidate_ops_match_vllm_triton_kernels(vllm_triton):
    # the CUDA asserts go; the edge flag is compared per column, not as a scalar (the same truth values: the
    # interpreter turns the scalar comparison into a uint8 "bool", and its store then rejects the mask built from it)
    edge = "keep = (keep != 0) | ((cols == width - 1) & (edge != 0))"
    mod = vllm_triton.load(CANDIDATES, {**vllm_triton.TRITON_IMPORTS, "    assert logits.is_cuda\n": "",
                                        edge: "keep = (keep != 0) | (tl.where(cols == width - 1, edge, 0) != 0)"})
    for seed, rr, starts in ((4, 1, True), (5, 2, False), (6, 3, True)):
        logits, ks, ke = _case(seed, rows=6, width=70, row_repeat=rr, starts=starts)
        ours, theirs = (torch.full((6, 3), 99, dtype=torch.int32) for _ in range(2))
        ops.dsv41_select_candidate_blocks(logits, ks, ke, 3, 16, ours, rr)
        mod.select_candidate_blocks(logits, ks, ke, 3, 16, theirs, rr)
        assert torch.equal(ours, theirs), (ours, theirs)
        a, b = logits.clone(), logits.clone()
        ops.dsv41_apply_candidate_mask(a, ks, ke, ours, 16, rr)
        mod.apply_candidate_mask(b, ks, ke, theirs, 16, rr)
        assert torch.equal(a, b)


def test_candidate_validation_names_the_argument():
    with pytest.raises(ValueError, match="dsv41_select_candidate_blocks: argument 'out'"):
        ops.dsv41_select_candidate_blocks(torch.zeros(2, 8), None, torch.tensor([8, 8]), 4, 2,
                                          torch.zeros(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="dsv41_apply_candidate_mask: argument 'row_ke'"):
        ops.dsv41_apply_candidate_mask(torch.zeros(4, 8), None, torch.tensor([8]), torch.zeros(4, 2,
                                       dtype=torch.int32), 2)
