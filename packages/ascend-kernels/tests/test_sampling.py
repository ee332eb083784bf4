"""Greedy and temperature / top-k / top-p sampling: support, greedy rows, reproducibility and a chi-square fit."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

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


def test_greedy_takes_the_lowest_id_among_ties():
    logits = torch.tensor([[0.1, 2.0, 2.0, -1.0], [5.0, 0.0, 0.0, 0.0]])
    assert ops.sample_greedy(logits).tolist() == [1, 0]
    assert ops.sample_greedy(torch.zeros(0, 4)).shape == (0,)


def test_zero_temperature_rows_are_greedy_and_others_are_not():
    logits = torch.tensor([[0.0, 1.0, 0.5]]).repeat(400, 1)
    temperature = torch.tensor([0.0, 1.0]).repeat(200)
    tokens = ops.sample(logits, temperature, generator=torch.Generator().manual_seed(0))
    assert (tokens[0::2] == 1).all()
    assert set(tokens[1::2].tolist()) == {0, 1, 2}


def test_top_k_and_top_p_restrict_the_support():
    logits = torch.log(torch.tensor([[0.05, 0.4, 0.1, 0.3, 0.15]])).repeat(3000, 1)
    gen = torch.Generator().manual_seed(1)
    top_k = torch.full((3000,), 2)
    assert set(ops.sample(logits, 1.0, top_k=top_k, generator=gen).tolist()) == {1, 3}
    top_p = torch.full((3000,), 0.8)  # 0.4 + 0.3 = 0.7 < 0.8, so 0.15 joins; 0.1 and 0.05 do not
    assert set(ops.sample(logits, 1.0, top_p=top_p, generator=gen).tolist()) == {1, 3, 4}
    disabled = ops.sample(logits, 1.0, top_k=torch.zeros(3000, dtype=torch.long), top_p=torch.ones(3000), generator=gen)
    assert set(disabled.tolist()) == {0, 1, 2, 3, 4}


def test_a_generator_makes_sampling_reproducible():
    logits = torch.randn(64, 50)
    first = ops.sample(logits, 0.8, generator=torch.Generator().manual_seed(7))
    second = ops.sample(logits, 0.8, generator=torch.Generator().manual_seed(7))
    assert torch.equal(first, second)


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, None, None), (0.7, 4, None), (1.3, 5, 0.9)])
def test_sampled_distribution_matches_the_filtered_softmax(temperature, top_k, top_p):
    rows = 30000
    base = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0])
    logits = base.repeat(rows, 1)
    k = None if top_k is None else torch.full((rows,), top_k)
    p = None if top_p is None else torch.full((rows,), top_p)
    tokens = ops.sample(
        logits, torch.full((rows,), temperature), top_k=k, top_p=p, generator=torch.Generator().manual_seed(3)
    )
    # naive: keep the k largest, then the most likely tokens until their mass reaches top_p
    probs = torch.softmax(base.double() / temperature, dim=0)
    keep = torch.zeros(6, dtype=torch.bool)
    order = torch.argsort(probs, descending=True).tolist()
    if top_k is not None:
        order = order[:top_k]
    filtered = torch.zeros(6, dtype=torch.float64)
    filtered[order] = probs[order] / probs[order].sum()
    mass = 0.0
    for token in order:
        keep[token] = True
        mass += float(filtered[token])
        if top_p is not None and mass >= top_p:
            break
    final = torch.where(keep, filtered, 0.0)
    assert chi_square_p_value(tokens, final / final.sum()) > ALPHA


def test_top_k_keeps_ties_at_the_kth_logit():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.0]]).repeat(500, 1)
    tokens = ops.sample(
        logits, 1.0, top_k=torch.ones(500, dtype=torch.long), generator=torch.Generator().manual_seed(4)
    )
    assert set(tokens.tolist()) == {1, 2}


def test_top_k_ties_survive_when_top_p_is_also_given():
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0]]).repeat(2000, 1)
    tokens = ops.sample(
        logits,
        1.0,
        top_k=torch.full((2000,), 2),
        top_p=torch.full((2000,), 0.999),
        generator=torch.Generator().manual_seed(5),
    )
    assert set(tokens.tolist()) == {0, 1, 2, 3}
