"""`ngram_drafts` (the MRV2 n-gram speculator's torch scan) against the rule upstream's Triton kernels implement.

The rule, from `vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`: the longest suffix n-gram (min_n..max_n) that
occurs earlier and is followed by at least one token, rightmost occurrence; draft the K tokens after it, the last
sampled token where the history ends (or for every slot without a match, or for a row that sampled nothing).
"""

from __future__ import annotations

import random

import pytest
import torch

from ascend_specdecode.dispatch import select_speculator
from ascend_specdecode.speculators.ngram import AscendNgramSpeculator, ngram_drafts


def rule(ctx: list[int], last: int, min_n: int, max_n: int, k: int, sampled: bool = True) -> list[int]:
    if sampled and len(ctx) >= min_n:
        for n in range(max_n, min_n - 1, -1):
            for pos in range(len(ctx) - n - 1, -1, -1):
                if ctx[pos:pos + n] == ctx[len(ctx) - n:]:
                    start = pos + n
                    return [ctx[start + j] if start + j < len(ctx) else last for j in range(k)]
    return [last] * k


@pytest.mark.parametrize(("min_n", "max_n", "k"), [(1, 3, 3), (2, 4, 5), (1, 1, 1), (3, 3, 2)])
def test_drafts_follow_the_rule_on_random_batches(min_n, max_n, k):
    rng = random.Random(min_n * 100 + max_n * 10 + k)
    max_reqs, width = 6, 40
    for _ in range(40):
        tokens = torch.zeros(max_reqs, width, dtype=torch.int32)
        lengths = [rng.randrange(0, width + 1) for _ in range(max_reqs)]
        histories = [[rng.randrange(3) for _ in range(n)] for n in lengths]
        for r, h in enumerate(histories):
            tokens[r, :len(h)] = torch.tensor(h, dtype=torch.int32)
            tokens[r, len(h):] = 7  # stale tokens past the history must never match or be copied
        last = torch.tensor([[rng.randrange(3, 6)] for _ in range(max_reqs)], dtype=torch.int64)
        num_reqs = rng.randrange(1, max_reqs + 1)
        idx = torch.randperm(max_reqs, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))[:num_reqs]
        sampled = torch.tensor([rng.random() < 0.8 for _ in range(num_reqs)], dtype=torch.int32)
        got = ngram_drafts(tokens, idx, torch.tensor(lengths, dtype=torch.int32), sampled, last, min_n, max_n, k)
        assert got.dtype == torch.int64 and got.shape == (num_reqs, k)
        for b in range(num_reqs):
            r = int(idx[b])
            assert got[b].tolist() == rule(histories[r], int(last[r]), min_n, max_n, k, bool(sampled[b])), (
                histories[r], int(sampled[b]))


def test_longest_ngram_wins_over_a_later_shorter_one():
    ctx = [1, 2, 3, 9, 8, 3, 4, 1, 2, 3]  # "1 2 3" at 0 (then 9 8) beats "3" at 5 (then 4 1)
    tokens = torch.tensor([ctx], dtype=torch.int32)
    got = ngram_drafts(tokens, torch.tensor([0]), torch.tensor([len(ctx)]), torch.tensor([1]), torch.tensor([[3]]),
                       1, 3, 2)
    assert got.tolist() == [[9, 8]]


def test_padded_rows_are_ignored():
    tokens = torch.tensor([[1, 2, 1, 2]], dtype=torch.int32)
    got = ngram_drafts(tokens, torch.tensor([0, -1]), torch.tensor([4]), torch.tensor([1, 1]), torch.tensor([[2]]),
                       1, 2, 2)
    assert got[0].tolist() == [1, 2]


def test_ngram_dispatches_to_the_ascend_ngram_speculator():
    from vllm.v1.worker.gpu.spec_decode.ngram.speculator import NgramGPUSpeculator

    class Spec:
        method = "ngram"
        draft_model_config = None

    cls = select_speculator(Spec())
    assert cls is AscendNgramSpeculator and issubclass(cls, NgramGPUSpeculator)
