"""Greedy sampling and the top-k / top-p filter: the filter's support against a naive formulation, vLLM's own filter
as an anchor, and a chi-square fit of drawing from the filtered softmax."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops
from ascend_kernels.reference.sampling import exponential_race

ALPHA = 1e-3  # chi-square tests reject a correct sampler with probability 0.1 % (fixed seeds make them repeatable)


def chi_square_p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    """P-value of observed token counts against `probs` (categories with zero probability must never occur)."""
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    support = probs > 0
    assert counts[~support].sum() == 0, "sampled a token outside the support"
    expected = probs[support].double() * tokens.numel()
    stat = ((counts[support] - expected) ** 2 / expected).sum()
    df = int(support.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


def kept(filtered: torch.Tensor) -> list[set[int]]:
    return [set(torch.nonzero(row > float("-inf")).flatten().tolist()) for row in filtered]


def test_greedy_takes_the_lowest_id_among_ties():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0]])
    assert ops.sample_greedy(logits).tolist() == [1, 0]
    assert ops.sample_greedy(torch.zeros(0, 4)).shape == (0,)


def test_top_k_and_top_p_restrict_the_support_per_row():
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])).repeat(4, 1)
    top_k = torch.tensor([2, 0, 5, 3])
    top_p = torch.tensor([1.0, 0.8, 1.0, 0.6])  # row 1: 0.4 + 0.3 = 0.7 < 0.8, so 0.15 joins; row 3: 0.4 + 0.3
    assert kept(ops.top_k_top_p(logits, top_k=top_k)) == [{1, 3}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}, {1, 3, 4}]
    assert kept(ops.top_k_top_p(logits, top_p=top_p)) == [{0, 1, 2, 3, 4}, {1, 3, 4}, {0, 1, 2, 3, 4}, {1, 3}]
    assert kept(ops.top_k_top_p(logits, top_k, top_p)) == [{1, 3}, {1, 3, 4}, {0, 1, 2, 3, 4}, {1, 3}]
    assert ops.top_k_top_p(logits) is logits
    kept_values = ops.top_k_top_p(logits, top_k, top_p)
    assert torch.equal(kept_values[kept_values > float("-inf")], logits[kept_values > float("-inf")])


def test_top_k_keeps_ties_at_the_kth_logit_with_and_without_top_p():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0], [3.0, 2.0, 2.0, 2.0]])
    assert kept(ops.top_k_top_p(logits, top_k=torch.tensor([1, 2]))) == [{1, 2}, {0, 1, 2, 3}]
    assert kept(ops.top_k_top_p(logits, torch.tensor([1, 2]), torch.tensor([0.999, 0.999]))) == [{1, 2}, {0, 1, 2, 3}]


def test_the_filter_equals_vllms_own():
    """vLLM's torch filter (the one its samplers fall back to) keeps the same tokens on random float32 rows (vLLM's
    samplers filter float32 logits; which of several exactly equal logits at a top-p edge survives is the sort's
    choice, in vLLM's filters as in ours, so rows with ties are not compared)."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=g) * 3
    top_k = torch.randint(1, 1001, (64,), generator=g)
    top_k[::5] = 1000  # vLLM's "no limit" is the vocabulary size
    top_p = torch.rand(64, generator=g).clamp(min=0.05)
    top_p[::7] = 1.0
    for k, p in ((top_k, None), (None, top_p), (top_k, top_p)):
        ours = ops.top_k_top_p(logits, k, p)
        theirs = apply_top_k_top_p_pytorch(logits.clone(), k, p)
        assert kept(ours) == kept(theirs)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 4, None), (1.3, 5, 0.9)])
def test_drawing_from_the_filtered_softmax_fits_it(temperature, top_k, top_p):
    rows = 30000
    base = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0])
    logits = base.repeat(rows, 1) / temperature
    k = None if top_k is None else torch.full((rows,), top_k)
    p = None if top_p is None else torch.full((rows,), top_p)
    probs = torch.softmax(ops.top_k_top_p(logits, top_k=k, top_p=p), dim=-1)
    tokens = exponential_race(probs, torch.Generator().manual_seed(3))
    # naive: keep the k largest, then the most likely tokens until their mass reaches top_p
    exact = torch.softmax(base.double() / temperature, dim=0)
    keep = torch.zeros(6, dtype=torch.bool)
    order = torch.argsort(exact, descending=True).tolist()
    if top_k is not None:
        order = order[:top_k]
    filtered = torch.zeros(6, dtype=torch.float64)
    filtered[order] = exact[order] / exact[order].sum()
    mass = 0.0
    for token in order:
        keep[token] = True
        mass += float(filtered[token])
        if top_p is not None and mass >= top_p:
            break
    final = torch.where(keep, filtered, 0.0)
    assert chi_square_p_value(tokens, final / final.sum()) > ALPHA
