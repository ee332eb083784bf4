"""`moe_gating_topk` and `fused_moe` against naive float64 formulations (per token, per expert, in Python loops)."""

from __future__ import annotations

import math

import pytest
import torch

from ascend_kernels import ops


def _naive_gating(logits, topk, *, scoring, renormalize, groups=None, topk_group=None, bias=None, scale=1.0):
    """Per token: scores, biased selection, group filter, top-k; float64 Python."""
    weights, ids = [], []
    for row in logits.double().tolist():
        if scoring == "softmax":
            m = max(row)
            ex = [math.exp(v - m) for v in row]
            scores = [v / sum(ex) for v in ex]
        elif scoring == "sqrtsoftplus":
            scores = [math.sqrt(math.log1p(math.exp(v))) for v in row]
        else:
            scores = [1 / (1 + math.exp(-v)) for v in row]
        select = [s + (0.0 if bias is None else float(bias[e])) for e, s in enumerate(scores)]
        allowed = set(range(len(row)))
        if groups:
            size = len(row) // groups
            members = [sorted(select[g * size:(g + 1) * size], reverse=True) for g in range(groups)]
            group_scores = [m[0] + m[1] if bias is not None else m[0] for m in members]
            kept = sorted(range(groups), key=lambda g: -group_scores[g])[:topk_group]
            allowed = {e for g in kept for e in range(g * size, (g + 1) * size)}
        best = sorted(allowed, key=lambda e: -select[e])[:topk]
        w = [scores[e] for e in best]
        if renormalize:
            w = [v / sum(w) for v in w]
        weights.append([v * scale for v in w])
        ids.append(best)
    return torch.tensor(weights, dtype=torch.float64), ids


@pytest.mark.parametrize("scoring", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("renormalize", [False, True])
def test_plain_gating_matches_naive(scoring, renormalize):
    logits = torch.randn(7, 8, generator=torch.Generator().manual_seed(1))
    weights, ids = ops.moe_gating_topk(logits, 3, scoring_func=scoring, renormalize=renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int32 and ids.shape == (7, 3)
    expected_w, expected_ids = _naive_gating(logits, 3, scoring=scoring, renormalize=renormalize)
    assert ids.tolist() == expected_ids
    torch.testing.assert_close(weights.double(), expected_w, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_grouped_biased_gating_matches_naive(with_bias, scoring):
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(9, 16, generator=gen)
    bias = torch.randn(16, generator=gen) * 0.3 if with_bias else None
    weights, ids = ops.moe_gating_topk(logits, 3, scoring_func=scoring, renormalize=True, num_expert_group=4,
                                       topk_group=2, e_score_correction_bias=bias, routed_scaling_factor=2.5)
    expected_w, expected_ids = _naive_gating(logits, 3, scoring=scoring, renormalize=True, groups=4, topk_group=2,
                                             bias=bias, scale=2.5)
    assert ids.tolist() == expected_ids
    torch.testing.assert_close(weights.double(), expected_w, rtol=1e-5, atol=1e-6)
    # Only experts of the kept groups are ever chosen: at most topk_group distinct groups per token.
    assert all(len({e // 4 for e in row}) <= 2 for row in ids.tolist())


def test_sqrtsoftplus_biased_gating_as_deepseek_v4_routes():
    """V4: sqrt(softplus) scores, the noaux_tc bias only steers selection, renormalized then scaled (1.5)."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 16, generator=gen) * 3
    bias = torch.randn(16, generator=gen)
    weights, ids = ops.moe_gating_topk(logits, 4, scoring_func="sqrtsoftplus", renormalize=True,
                                       e_score_correction_bias=bias, routed_scaling_factor=1.5)
    expected_w, expected_ids = _naive_gating(logits, 4, scoring="sqrtsoftplus", renormalize=True, bias=bias,
                                             scale=1.5)
    assert ids.tolist() == expected_ids
    torch.testing.assert_close(weights.double(), expected_w, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weights.sum(-1), torch.full((6,), 1.5))


def test_bias_steers_selection_but_not_weights():
    logits = torch.zeros(3, 8)
    bias = torch.zeros(8)
    bias[5] = 1.0
    weights, ids = ops.moe_gating_topk(logits, 1, scoring_func="sigmoid", renormalize=False,
                                       e_score_correction_bias=bias)
    assert ids[:, 0].tolist() == [5, 5, 5]
    torch.testing.assert_close(weights[:, 0], torch.full((3,), 0.5))  # sigmoid(0), unbiased


@pytest.mark.parametrize("bad, word", [
    (dict(scoring_func="relu"), "scoring_func"),
    (dict(num_expert_group=3, topk_group=1), "num_expert_group"),
    (dict(num_expert_group=4, topk_group=5), "topk_group"),
    (dict(num_expert_group=8, topk_group=1, e_score_correction_bias=torch.zeros(8)), "num_expert_group"),
    (dict(e_score_correction_bias=torch.zeros(7)), "e_score_correction_bias"),
    (dict(routed_scaling_factor=0.0), "routed_scaling_factor"),
])
def test_gating_rejects_bad_arguments_by_name(bad, word):
    with pytest.raises(ValueError, match=word):
        ops.moe_gating_topk(torch.randn(2, 8), 2, **bad)


def test_grouped_topk_beyond_kept_groups_is_rejected():
    with pytest.raises(ValueError, match="topk"):
        ops.moe_gating_topk(torch.randn(2, 8), 3, num_expert_group=4, topk_group=1)


def _naive_moe(x, w13, w2, weights, ids, b13=None, b2=None, limit=None):
    t, hidden = x.shape
    inter = w2.shape[2]
    out = torch.zeros(t, hidden, dtype=torch.float64)
    for i in range(t):
        for j in range(ids.shape[1]):
            e = int(ids[i, j])
            if e < 0:
                continue
            gate_up = w13[e].double() @ x[i].double() + (0 if b13 is None else b13[e].double())
            gate, up = gate_up[:inter], gate_up[inter:]
            if limit is not None:
                gate, up = torch.clamp(gate, max=limit), torch.clamp(up, -limit, limit)
            y = w2[e].double() @ (gate / (1 + torch.exp(-gate)) * up) + (0 if b2 is None else b2[e].double())
            out[i] += float(weights[i, j]) * y
    return out


@pytest.mark.parametrize("tokens", [3, 40])  # the per-pair gather (decode) and the per-expert loop (prefill)
@pytest.mark.parametrize("biased", [False, True])
def test_fused_moe_matches_naive(tokens, biased):
    gen = torch.Generator().manual_seed(3)
    hidden, inter, experts, k = 16, 8, 6, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) / 4
    w2 = torch.randn(experts, hidden, inter, generator=gen) / 4
    b13 = torch.randn(experts, 2 * inter, generator=gen) if biased else None
    b2 = torch.randn(experts, hidden, generator=gen) if biased else None
    weights, ids = ops.moe_gating_topk(torch.randn(tokens, experts, generator=gen), k)
    ids[0] = torch.tensor([3, 3], dtype=torch.int32)  # one expert twice for a token
    ids[1, 1] = -1  # a pair held by another rank
    ids[2] = -1  # a token with no local pair
    out = ops.fused_moe(x, w13, w2, weights, ids, w13_bias=b13, w2_bias=b2)
    torch.testing.assert_close(out.double(), _naive_moe(x, w13, w2, weights, ids, b13, b2), rtol=1e-5, atol=1e-5)
    assert out[2].abs().max() == 0


def test_fused_moe_half_precision_and_empty_batch():
    hidden, inter, experts = 16, 8, 4
    x = torch.randn(5, hidden).to(torch.bfloat16)
    w13 = (torch.randn(experts, 2 * inter, hidden) / 4).to(torch.bfloat16)
    w2 = (torch.randn(experts, hidden, inter) / 4).to(torch.bfloat16)
    weights, ids = ops.moe_gating_topk(torch.randn(5, experts), 2)
    out = ops.fused_moe(x, w13, w2, weights, ids)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _naive_moe(x, w13, w2, weights, ids), rtol=2e-2, atol=2e-2)
    assert ops.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, hidden)


def test_fused_moe_rejects_mismatched_bias():
    x, w13, w2 = torch.randn(2, 16), torch.randn(4, 16, 16), torch.randn(4, 16, 8)
    weights, ids = ops.moe_gating_topk(torch.randn(2, 4), 2)
    with pytest.raises(ValueError, match="w2_bias"):
        ops.fused_moe(x, w13, w2, weights, ids, w2_bias=torch.zeros(4, 8))


@pytest.mark.parametrize("tokens", [3, 40])
def test_fused_moe_swiglu_limit_clamps_gate_and_up(tokens):
    gen = torch.Generator().manual_seed(5)
    hidden, inter, experts = 16, 8, 6
    x = torch.randn(tokens, hidden, generator=gen) * 4
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen)  # pre-activations well past the limit
    w2 = torch.randn(experts, hidden, inter, generator=gen) / 4
    weights, ids = ops.moe_gating_topk(torch.randn(tokens, experts, generator=gen), 2)
    out = ops.fused_moe(x, w13, w2, weights, ids, swiglu_limit=3.0)
    expected = _naive_moe(x, w13, w2, weights, ids, limit=3.0)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out.double(), _naive_moe(x, w13, w2, weights, ids), rtol=1e-3, atol=1e-3)
    with pytest.raises(ValueError, match="swiglu_limit"):
        ops.fused_moe(x, w13, w2, weights, ids, swiglu_limit=0.0)

