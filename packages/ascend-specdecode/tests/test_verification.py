"""Verification through the `ascend_kernels` rejection sampler, in vLLM V1's flattened layout.

The rule is stated plainly as a per-request loop; the bridge (padding, dtypes, the kernel's decision) must agree.
"""

from __future__ import annotations

import pytest
import torch

from ascend_specdecode.kernel_bridge import PLACEHOLDER, greedy_verify, verify

VOCAB = 6


def rule(drafts, target, counts, bonus, k):
    rows, start = [], 0
    for r, n in enumerate(counts):
        row = [PLACEHOLDER] * (k + 1)
        for j in range(n):
            row[j] = target[start + j]
            if drafts[start + j] != target[start + j]:
                break
        else:
            row[n] = bonus[r]
        rows.append(row)
        start += n
    return rows


def one_hot_logits(ids: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(ids, VOCAB).float() * 5.0


@pytest.mark.parametrize("seed", range(20))
def test_greedy_verify_matches_the_rule(seed):
    gen = torch.Generator().manual_seed(seed)
    k = int(torch.randint(1, 5, (1,), generator=gen))
    counts = torch.randint(0, k + 1, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
    total = sum(counts)
    target = torch.randint(0, VOCAB, (total,), generator=gen)
    drafts = torch.where(
        torch.rand(total, generator=gen) < 0.7, target, torch.randint(0, VOCAB, (total,), generator=gen)
    )
    bonus = torch.randint(100, 200, (len(counts), 1), generator=gen)
    cu = torch.tensor(counts).cumsum(0).to(torch.int32)
    out = greedy_verify(drafts.to(torch.int32), one_hot_logits(target), cu, bonus, k)
    assert out.dtype == torch.int32 and out.shape == (len(counts), k + 1)
    assert out.tolist() == rule(drafts.tolist(), target.tolist(), counts, bonus.flatten().tolist(), k)


def test_equal_drafts_are_all_accepted_and_get_the_bonus():
    target = torch.tensor([5, 4, 3, 2, 1, 0])
    cu = torch.tensor([3, 6], dtype=torch.int32)
    out = greedy_verify(target.to(torch.int32), one_hot_logits(target), cu, torch.tensor([[42], [43]]), 3)
    assert out.tolist() == [[5, 4, 3, 42], [2, 1, 0, 43]]


def test_sampled_rows_accept_certain_drafts_and_never_emit_impossible_tokens():
    drafts = torch.tensor([1, 2, 3, 4], dtype=torch.int32)
    cu = torch.tensor([2, 4], dtype=torch.int32)
    probs = torch.zeros(4, VOCAB)
    probs[0, 1] = probs[1, 2] = 1.0  # request 0: the target is certain of each draft
    probs[2, 5] = probs[3, 5] = 1.0  # request 1: the target never picks its drafts
    out = verify(drafts, cu, 2, None, probs, torch.tensor([9, 9]), temperature=torch.ones(2), target_is_probs=True)
    assert out.tolist() == [[1, 2, 9], [5, PLACEHOLDER, PLACEHOLDER]]


def test_sampling_constraints_per_draft_row():
    """Each request's temperature (greedy rows unscaled), top-k and top-p apply to its own draft rows, as upstream's
    `apply_sampling_constraints` defines them (its CPU expand fallback is what this replaces)."""
    from types import SimpleNamespace

    from ascend_kernels.reference.sampling import apply_top_k_top_p
    from ascend_specdecode.verification import apply_sampling_constraints

    g = torch.Generator().manual_seed(0)
    counts = [2, 0, 3]
    logits = torch.randn(sum(counts), 12, generator=g)
    meta = SimpleNamespace(
        all_greedy=False,
        temperature=torch.tensor([0.5, 1.0, 0.0]),
        top_k=torch.tensor([3, 0, 12]),
        top_p=torch.tensor([1.0, 0.9, 0.6]),
    )
    out = apply_sampling_constraints(logits.clone(), counts, meta)
    rows = torch.tensor([0, 0, 2, 2, 2])
    scale = torch.tensor([0.5, 1.0, 1.0])[rows]
    expected = apply_top_k_top_p(logits / scale[:, None], meta.top_k[rows], meta.top_p[rows])
    assert torch.equal(torch.isinf(out), torch.isinf(expected))
    assert torch.allclose(out[~torch.isinf(out)], expected[~torch.isinf(expected)])
    greedy = SimpleNamespace(all_greedy=True)
    assert apply_sampling_constraints(logits, counts, greedy) is logits
