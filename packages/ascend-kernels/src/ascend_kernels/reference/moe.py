"""MoE routing and experts (reference): top-k softmax gating and a grouped-expert MLP.

Tokens are sorted by expert so each expert runs one matmul over all its tokens (the grouped-GEMM shape NPU kernels
use), with float32 accumulation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def topk_softmax(gating_logits, topk, renormalize):
    probs = torch.softmax(gating_logits.float(), dim=-1)
    weights, ids = torch.topk(probs, topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def fused_moe_reference(hidden_states, w13, w2, topk_weights, topk_ids):
    t, hidden = hidden_states.shape
    k = topk_ids.shape[1]
    out = torch.zeros(t, hidden, dtype=torch.float32, device=hidden_states.device)
    if t == 0:
        return out.to(hidden_states.dtype)
    flat_ids = topk_ids.reshape(-1).long()
    order = torch.argsort(flat_ids, stable=True)
    token_of = order // k  # the token each sorted (token, slot) pair belongs to
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    weights = topk_weights.reshape(-1).float()[order]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        tokens = token_of[start : start + count]
        x = hidden_states.index_select(0, tokens).float()
        gate_up = x @ w13[expert].float().t()
        inter = gate_up.shape[-1] // 2
        act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
        y = (act @ w2[expert].float().t()) * weights[start : start + count, None]
        out.index_add_(0, tokens, y)
        start += count
    return out.to(hidden_states.dtype)
