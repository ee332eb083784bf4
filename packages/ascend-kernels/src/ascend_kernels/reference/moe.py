"""MoE routing and experts (reference): top-k gating (plain, grouped, biased) and a grouped-expert MLP.

Tokens are sorted by expert so each expert runs one matmul over all its tokens (the grouped-GEMM shape NPU kernels
use), with float32 accumulation. For few (token, expert) pairs, as in decode, gathering each pair's expert weights
into one batched matmul costs less than a loop over experts; both orders sum in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Below this many (token, expert) pairs `fused_moe` gathers weights per pair (one bmm) instead of looping experts.
_GATHER_PAIRS = 64


def moe_gating_topk(router_logits, topk, *, scoring_func="softmax", renormalize=True, num_expert_group=None,
                    topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0):
    logits = router_logits.float()
    if scoring_func == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring_func == "sqrtsoftplus":  # DeepSeek V4
        scores = torch.sqrt(F.softplus(logits))
    else:
        scores = torch.sigmoid(logits)
    select = scores if e_score_correction_bias is None else scores + e_score_correction_bias.float()
    if num_expert_group is not None and num_expert_group > 1:
        t, e = select.shape
        grouped = select.view(t, num_expert_group, e // num_expert_group)
        # With a correction bias a group ranks by its two best biased scores (DeepSeek-V3), else by its best.
        group_scores = (grouped.topk(2, dim=-1).values.sum(dim=-1) if e_score_correction_bias is not None
                        else grouped.max(dim=-1).values)
        keep = torch.topk(group_scores, topk_group, dim=-1).indices
        group_mask = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, keep, True)
        select = select.masked_fill(~group_mask.repeat_interleave(e // num_expert_group, dim=1), float("-inf"))
    ids = torch.topk(select, topk, dim=-1).indices
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)


def _swiglu(gate_up, limit):
    """silu(gate) * up; with a limit (DeepSeek V4) gate is clamped from above and up to [-limit, limit] first."""
    inter = gate_up.shape[-1] // 2
    gate, up = gate_up[:, :inter], gate_up[:, inter:]
    if limit is not None:
        gate, up = gate.clamp(max=limit), up.clamp(-limit, limit)
    return F.silu(gate) * up


def _expert_mlp(x, w13, w2, b13=None, b2=None, limit=None):
    gate_up = x @ w13.float().t() if b13 is None else torch.addmm(b13.float(), x, w13.float().t())
    act = _swiglu(gate_up, limit)
    return act @ w2.float().t() if b2 is None else torch.addmm(b2.float(), act, w2.float().t())


def fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, w13_bias=None, w2_bias=None, swiglu_limit=None):
    t, hidden = hidden_states.shape
    out = torch.zeros(t, hidden, dtype=torch.float32, device=hidden_states.device)
    if t == 0:
        return out.to(hidden_states.dtype)
    k = topk_ids.shape[1]
    flat_ids = topk_ids.reshape(-1).long()
    valid = flat_ids >= 0
    pairs = torch.nonzero(valid).squeeze(1)
    if pairs.numel() == 0:
        return out.to(hidden_states.dtype)
    ids = flat_ids[pairs]
    tokens = pairs // k
    weights = topk_weights.reshape(-1)[pairs].float()
    x = hidden_states.index_select(0, tokens).float()
    if pairs.numel() <= _GATHER_PAIRS:
        gate_up = torch.bmm(w13.index_select(0, ids).float(), x.unsqueeze(-1)).squeeze(-1)
        if w13_bias is not None:
            gate_up = gate_up + w13_bias.index_select(0, ids).float()
        act = _swiglu(gate_up, swiglu_limit)
        y = torch.bmm(w2.index_select(0, ids).float(), act.unsqueeze(-1)).squeeze(-1)
        if w2_bias is not None:
            y = y + w2_bias.index_select(0, ids).float()
        out.index_add_(0, tokens, y * weights[:, None])
        return out.to(hidden_states.dtype)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=w13.shape[0]).tolist()
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        sel = order[start : start + count]
        y = _expert_mlp(x.index_select(0, sel), w13[expert], w2[expert],
                        None if w13_bias is None else w13_bias[expert], None if w2_bias is None else w2_bias[expert],
                        swiglu_limit)
        out.index_add_(0, tokens.index_select(0, sel), y * weights.index_select(0, sel)[:, None])
        start += count
    return out.to(hidden_states.dtype)
