"""Greedy verification: the kernel bridge against a per-request loop that states the rule plainly."""

from __future__ import annotations

import pytest
import torch

from ascend_specdecode.kernel_bridge import PLACEHOLDER, greedy_verify


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


@pytest.mark.parametrize("seed", range(20))
def test_greedy_verify_matches_the_rule(seed):
    gen = torch.Generator().manual_seed(seed)
    k = int(torch.randint(1, 5, (1,), generator=gen))
    counts = torch.randint(0, k + 1, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
    total = sum(counts)
    target = torch.randint(0, 4, (total,), generator=gen)
    drafts = torch.where(torch.rand(total, generator=gen) < 0.7, target, torch.randint(0, 4, (total,), generator=gen))
    bonus = torch.randint(100, 200, (len(counts), 1), generator=gen)
    ends = torch.tensor(counts).cumsum(0).to(torch.int32)
    starts = ends - torch.tensor(counts, dtype=torch.int32)
    out = greedy_verify(drafts.to(torch.int32), target, starts, ends, bonus, k)
    assert out.dtype == torch.int32 and out.shape == (len(counts), k + 1)
    assert out.tolist() == rule(drafts.tolist(), target.tolist(), counts, bonus.flatten().tolist(), k)


def test_equal_drafts_are_all_accepted_and_get_the_bonus():
    target = torch.tensor([5, 6, 7, 8, 9, 10])
    ends = torch.tensor([3, 6], dtype=torch.int32)
    out = greedy_verify(target.clone(), target, ends - 3, ends, torch.tensor([[42], [43]]), 3)
    assert out.tolist() == [[5, 6, 7, 42], [8, 9, 10, 43]]
