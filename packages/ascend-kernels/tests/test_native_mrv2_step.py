"""Model Runner V2's per-step batch loops (`native/mrv2_step.c`) against per-row Python written from vLLM's Triton
kernels (`vllm/v1/worker/gpu/input_batch.py`); the platform's stand-in parity driver also holds them to the kernels
themselves, run in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels.reference import native_build, native_mrv2_step

DTYPES = [torch.int32, torch.int64]


def _batch(g: torch.Generator, num_reqs: int, slots: int, max_q: int = 5):
    """A batch of num_reqs distinct request slots out of `slots`, with query lengths in [1, max_q]."""
    idx = torch.randperm(slots, generator=g)[:num_reqs]
    lens = torch.randint(1, max_q + 1, (num_reqs,), generator=g)
    qsl = torch.zeros(num_reqs + 1, dtype=torch.int64)
    qsl[1:] = torch.cumsum(lens, 0)
    return idx, qsl


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("num_reqs", [0, 1, 4, 9])
def test_pos_seq_lens_continue_each_request_from_its_computed_tokens(native_loops, dt, num_reqs):
    g = torch.Generator().manual_seed(num_reqs)
    idx, qsl = _batch(g, num_reqs, 12)
    computed = torch.randint(0, 300, (12,), generator=g, dtype=torch.int32)
    pos, seq_lens = torch.full((64,), -7, dtype=torch.int64), torch.full((10,), -7, dtype=dt)
    assert native_mrv2_step.prepare_pos_seq_lens(pos, seq_lens, idx.to(dt), qsl.to(torch.int32), computed, 10)
    want_pos, want_sl = torch.full((64,), -7, dtype=torch.int64), torch.zeros(10, dtype=dt)
    for r in range(num_reqs):
        c, a, b = int(computed[idx[r]]), int(qsl[r]), int(qsl[r + 1])
        want_sl[r] = c + b - a
        want_pos[a:b] = torch.arange(c, c + b - a)
    assert torch.equal(pos, want_pos) and torch.equal(seq_lens, want_sl)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("new_sampled", [0, 1])
def test_combine_writes_logits_indices_sampled_and_draft_tokens(native_loops, dt, new_sampled):
    g = torch.Generator().manual_seed(3 + new_sampled)
    nr, slots, width = 6, 8, 3
    idx, qsl = _batch(g, nr, slots, max_q=6)
    q_lens = qsl[1:] - qsl[:-1]
    num_logits = torch.minimum(q_lens, torch.randint(1, width + 1 + new_sampled, (nr,), generator=g))
    cu = torch.zeros(nr + 1, dtype=torch.int64)
    cu[1:] = torch.cumsum(num_logits, 0)
    prefill = torch.randint(5, 40, (slots,), generator=g, dtype=torch.int32)
    seq_lens = (prefill[idx].long() + torch.randint(-3, 6, (nr,), generator=g)).to(torch.int32)
    last = torch.randint(0, 1000, (slots, 1), generator=g, dtype=torch.int64)
    drafts = torch.randint(0, 1000, (slots, width), generator=g, dtype=torch.int64)
    ids = torch.randint(0, 1000, (int(qsl[-1]) + 2,), generator=g, dtype=dt)
    indices = torch.full((int(cu[-1]) + 1,), -1, dtype=torch.int64)
    want_ids, want_indices = ids.clone(), indices.clone()
    for r in range(nr):
        req, nl, end = int(idx[r]), int(num_logits[r]), int(qsl[r + 1])
        want_indices[int(cu[r]) : int(cu[r]) + nl] = torch.arange(end - nl, end)
        if int(seq_lens[r]) <= int(prefill[req]):
            continue
        if new_sampled and int(seq_lens[r]) - nl >= int(prefill[req]):
            want_ids[end - nl] = int(last[req, 0])
        k = nl - new_sampled
        if k > 0:
            want_ids[end - k : end] = drafts[req, :k].to(dt)
    assert native_mrv2_step.combine_sampled_and_draft_tokens(ids, idx.to(dt), last, qsl.to(torch.int32), seq_lens,
                                                             prefill, drafts, width, cu.to(torch.int32), indices,
                                                             new_sampled)
    assert torch.equal(ids, want_ids) and torch.equal(indices, want_indices)


def test_chunked_prefill_rows_sample_and_reject_nothing(native_loops):
    idx = torch.tensor([2, 0, 1], dtype=torch.int64)
    seq_lens = torch.tensor([10, 3, 20], dtype=torch.int32)
    prefill = torch.tensor([8, 10, 10], dtype=torch.int32)  # request 0 (row 1) is still in its prompt
    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    sampled, rejected = torch.tensor([2, 1, 1], dtype=torch.int32), torch.full((3,), 9, dtype=torch.int32)
    assert native_mrv2_step.get_num_sampled_and_rejected(sampled, rejected, seq_lens, cu, idx, prefill)
    assert sampled.tolist() == [2, 0, 1] and rejected.tolist() == [1, 0, 1]


@pytest.mark.parametrize("with_counts", [True, False])
@pytest.mark.parametrize("with_qsl", [True, False])
def test_post_update_appends_counts_and_advances_the_state(native_loops, with_counts, with_qsl):
    g = torch.Generator().manual_seed(11)
    slots, width, vocab, hist = 6, 3, 50, 40
    idx = torch.tensor([4, -1, 0, 2], dtype=torch.int64)
    qsl = torch.tensor([0, 3, 4, 6, 9], dtype=torch.int32)
    num_sampled = torch.tensor([3, 1, 0, 2], dtype=torch.int32)
    num_rejected = torch.tensor([0, 0, 0, 1], dtype=torch.int32)
    sampled = torch.randint(0, vocab, (4, width), generator=g, dtype=torch.int64)
    computed = torch.randint(0, 20, (slots,), generator=g, dtype=torch.int32)
    total = torch.randint(0, 30, (slots,), generator=g, dtype=torch.int32)
    last = torch.full((slots, 1), -1, dtype=torch.int64)
    history = torch.zeros(slots, hist, dtype=torch.int32)
    counts = torch.zeros(slots, vocab, dtype=torch.int32) if with_counts else None
    want = [t.clone() if t is not None else None for t in (computed, total, last, history, counts)]
    for r in range(4):
        req = int(idx[r])
        if req < 0:
            continue
        n, start = int(num_sampled[r]), int(want[1][req])
        for j in range(n):
            want[3][req, start + j] = int(sampled[r, j])
            if with_counts:
                want[4][req, int(sampled[r, j])] += 1
        if n:
            want[2][req, 0] = int(sampled[r, n - 1])
            want[1][req] = start + n
        q = int(qsl[r + 1] - qsl[r]) if with_qsl else 0
        want[0][req] += q - int(num_rejected[r])
    assert native_mrv2_step.post_update(idx, computed, last, counts, vocab, sampled, num_sampled, num_rejected,
                                        qsl if with_qsl else None, history, hist, total)
    for got, expect in zip((computed, total, last, history, counts), want, strict=True):
        assert (got is None and expect is None) or torch.equal(got, expect)


def test_a_request_past_the_state_is_named_and_nothing_is_written(native_loops):
    idx = torch.tensor([1, 7], dtype=torch.int64)  # 7: past the 4 request slots
    computed, total = torch.zeros(4, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    last, history = torch.zeros(4, 1, dtype=torch.int64), torch.zeros(4, 16, dtype=torch.int32)
    sampled, ns, rj = torch.tensor([[5], [6]]), torch.ones(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    with pytest.raises(IndexError, match="batch row 1"):
        native_mrv2_step.post_update(idx, computed, last, None, 0, sampled, ns, rj, qsl, history, 16, total)
    assert not computed.any() and not total.any() and not last.any() and not history.any()
    pos, seq_lens = torch.zeros(4, dtype=torch.int64), torch.zeros(4, dtype=torch.int32)
    with pytest.raises(IndexError, match="batch row 1"):
        native_mrv2_step.prepare_pos_seq_lens(pos, seq_lens, idx, qsl, computed, 4)
    assert not pos.any() and not seq_lens.any()


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("num_reqs", [0, 3, 6])
def test_gather_block_table_copies_each_requests_blocks_and_zeroes_the_padding(native_loops, dt, num_reqs):
    """Written from vLLM's `_gather_block_tables_kernel`: row r takes src[idx[r], :num_blocks[idx[r]]], the rest of
    the row stays as it was; rows [num_reqs, padded) become 0; rows past padded stay."""
    g = torch.Generator().manual_seed(num_reqs)
    src = torch.randint(1, 999, (8, 5), generator=g).to(dt)
    counts = torch.tensor([0, 5, 2, 9, 1, 3, 4, 5], dtype=torch.int32)  # 9: more than a row holds (clamped)
    idx = torch.randperm(8, generator=g)[:num_reqs].to(torch.int32)
    dst = torch.full((8, 5), -7, dtype=dt)
    want = dst.clone()
    for r in range(num_reqs):
        n = min(int(counts[idx[r]]), 5)
        want[r, :n] = src[idx[r], :n]
    want[num_reqs:7] = 0
    assert native_mrv2_step.gather_block_table(src, counts, idx, dst, 7)
    assert torch.equal(dst, want)


def test_gather_block_table_names_a_request_past_the_table_and_writes_nothing(native_loops):
    src, dst = torch.ones(4, 3, dtype=torch.int32), torch.full((4, 3), -7, dtype=torch.int32)
    with pytest.raises(IndexError, match="batch row 1"):
        native_mrv2_step.gather_block_table(src, torch.ones(4, dtype=torch.int32), torch.tensor([0, 4]), dst, 3)
    assert (dst == -7).all()
    assert not native_mrv2_step.gather_block_table(src, torch.ones(4, dtype=torch.int32), torch.tensor([0]),
                                                   torch.zeros(4, 2, dtype=torch.int32), 2)  # another width


def test_a_history_that_would_overflow_is_refused(native_loops):
    idx = torch.tensor([0], dtype=torch.int64)
    total = torch.tensor([15], dtype=torch.int32)  # 15 of 16 history entries used: two more do not fit
    history = torch.zeros(1, 16, dtype=torch.int32)
    with pytest.raises(IndexError, match="batch row 0"):
        native_mrv2_step.post_update(idx, torch.zeros(1, dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int64),
                                     None, 0, torch.tensor([[3, 4]]), torch.tensor([2], dtype=torch.int32),
                                     torch.zeros(1, dtype=torch.int32), None, history, 16, total)
    assert not history.any() and int(total[0]) == 15


def test_offsets_that_go_backwards_are_refused(native_loops):
    pos, seq_lens = torch.zeros(8, dtype=torch.int64), torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="non-decreasing"):
        native_mrv2_step.prepare_pos_seq_lens(pos, seq_lens, torch.tensor([0, 1]), torch.tensor([0, 3, 2]),
                                              torch.zeros(2, dtype=torch.int32), 2)


def test_calls_it_cannot_take_are_left_to_the_caller(native_loops):
    """Float, strided or (without the library) any tensors: False, nothing written, the caller's formulation runs."""
    seq_lens = torch.zeros(2, dtype=torch.int32)
    args = (torch.zeros(4, dtype=torch.int64), seq_lens, torch.tensor([0, 1]), torch.tensor([0, 1, 2]))
    assert not native_mrv2_step.prepare_pos_seq_lens(*args, torch.ones(2), 2)  # float32 computed tokens
    strided = torch.ones(4, dtype=torch.int32)[::2]
    assert not native_mrv2_step.prepare_pos_seq_lens(*args, strided, 2)
    assert not seq_lens.any()
    before = native_build.calls_of("prepare_pos_seq_lens")
    assert native_mrv2_step.prepare_pos_seq_lens(*args, torch.ones(2, dtype=torch.int32), 2)
    assert native_build.calls_of("prepare_pos_seq_lens") == before + 1


def test_without_the_library_nothing_is_taken(torch_formulation):
    seq_lens = torch.zeros(2, dtype=torch.int32)
    assert not native_mrv2_step.prepare_pos_seq_lens(torch.zeros(4, dtype=torch.int64), seq_lens,
                                                     torch.tensor([0, 1]), torch.tensor([0, 1, 2]),
                                                     torch.ones(2, dtype=torch.int32), 2)
    assert not seq_lens.any()
