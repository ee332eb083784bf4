"""The rejection sampler: acceptance when draft == target, greedy rows, padding, and lossless output distributions."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

ALPHA = 1e-3  # chi-square tests reject a correct sampler with probability 0.1 % (fixed seeds make them repeatable)


def chi_square_p_value(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    expected = probs.double() * tokens.numel()
    stat = ((counts - expected) ** 2 / expected).sum()
    df = probs.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("target_is_probs", [False, True])
def test_draft_equal_to_target_accepts_every_draft(target_is_probs):
    gen = torch.Generator().manual_seed(0)
    b, k, v = 64, 4, 20
    logits = torch.randn(b, k, v, generator=gen)
    probs = torch.softmax(logits, dim=-1)
    drafts = torch.multinomial(probs.view(-1, v), 1, generator=gen).view(b, k)
    bonus = torch.randint(0, v, (b,), generator=gen)
    target = probs if target_is_probs else logits
    out, accepted = ops.rejection_sample(
        drafts, probs, target, bonus, temperature=torch.ones(b), generator=gen, target_is_probs=target_is_probs
    )
    assert accepted.tolist() == [k] * b
    assert torch.equal(out, torch.cat([drafts, bonus[:, None]], dim=1))


def test_greedy_rows_accept_the_argmax_prefix_and_replace_the_first_miss():
    logits = torch.randn(3, 3, 10)
    best = logits.argmax(dim=-1)
    drafts = best.clone()
    drafts[0, 1] = (best[0, 1] + 1) % 10  # request 0 misses at position 1
    drafts[2, 2] = -1  # request 2 drafted only two tokens
    bonus = torch.tensor([[7], [8], [9]])
    out, accepted = ops.rejection_sample(drafts, None, logits, bonus)  # temperature None: all greedy
    assert accepted.tolist() == [1, 3, 2]
    assert out[0].tolist() == [best[0, 0].item(), best[0, 1].item(), -1, -1]
    assert out[1].tolist() == best[1].tolist() + [8]
    assert out[2].tolist() == best[2, :2].tolist() + [9, -1]


def test_requests_without_drafts_emit_their_bonus_token():
    drafts = torch.full((2, 3), -1)
    out, accepted = ops.rejection_sample(
        drafts, None, torch.randn(2, 3, 5), torch.tensor([4, 1]), temperature=torch.ones(2)
    )
    assert accepted.tolist() == [0, 0] and out.tolist() == [[4, -1, -1, -1], [1, -1, -1, -1]]
    out, accepted = ops.rejection_sample(
        torch.zeros(2, 0, dtype=torch.long), None, torch.randn(2, 0, 5), torch.tensor([4, 1])
    )
    assert out.tolist() == [[4], [1]] and accepted.tolist() == [0, 0]


@pytest.mark.parametrize("drafter", ["stochastic", "deterministic"])
def test_output_tokens_follow_the_target_distribution(drafter):
    """Chi-square at ALPHA: the first output token ~ p0; the second, where the first draft was accepted, ~ p1."""
    gen = torch.Generator().manual_seed(11)
    b, v = 40000, 6
    p = torch.softmax(torch.tensor([[1.0, 0.5, -1.0, 0.0, 2.0, -0.5], [0.0, 1.5, 0.3, -1.0, 0.2, 1.0]]), dim=-1)
    q = torch.softmax(torch.tensor([[0.0, 2.0, 0.0, 1.0, -1.0, 0.5], [1.0, -1.0, 0.5, 0.0, 0.0, 2.0]]), dim=-1)
    drafts = torch.stack([torch.multinomial(q[i], b, replacement=True, generator=gen) for i in range(2)], dim=1)
    draft_probs = q[None].expand(b, 2, v).contiguous() if drafter == "stochastic" else None
    bonus = torch.multinomial(torch.full((v,), 1.0 / v), b, replacement=True, generator=gen)
    target = torch.log(p)[None].expand(b, 2, v).contiguous()
    out, accepted = ops.rejection_sample(drafts, draft_probs, target, bonus, temperature=torch.ones(b), generator=gen)
    assert chi_square_p_value(out[:, 0], p[0]) > ALPHA
    second = out[accepted >= 1, 1]
    assert second.numel() > 3000
    assert chi_square_p_value(second, p[1]) > ALPHA
    # and the acceptance rate of the first draft is sum_x min(p0(x), q0(x)) (1 - total variation distance)
    q0 = q[0] if drafter == "stochastic" else None
    expected_rate = torch.minimum(p[0], q0).sum() if q0 is not None else (q[0] * p[0]).sum()
    assert abs((accepted >= 1).double().mean() - expected_rate) < 0.01


def test_temperature_and_top_k_shape_the_target():
    # With top_k=1 the target is the argmax, so a non-argmax draft is always rejected and replaced by the argmax.
    logits = torch.tensor([[[0.0, 3.0, 1.0]]]).repeat(200, 1, 1)
    drafts = torch.full((200, 1), 2)
    out, accepted = ops.rejection_sample(
        drafts,
        None,
        logits,
        torch.zeros(200, dtype=torch.long),
        temperature=torch.full((200,), 0.9),
        top_k=torch.ones(200, dtype=torch.long),
        generator=torch.Generator().manual_seed(2),
    )
    assert accepted.sum() == 0 and (out[:, 0] == 1).all()
