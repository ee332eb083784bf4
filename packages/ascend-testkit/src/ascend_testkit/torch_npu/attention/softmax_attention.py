"""One request's attention in float64: softmax(scale * (q k^T + q_rope k_rope^T) over visible keys) v, and its LSE.

The LSE is the natural-log normalizer of the scaled logits (max + log(sum(exp(x - max)))), the quantity
npu_attention_update merges. A row that sees no key gives output 0 and LSE -inf (the limit of an empty sum). A
learnable sink adds one logit per head to the normalizer only (it has no value row), and is counted in the LSE.
"""

from __future__ import annotations

import torch


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, visible: torch.Tensor, scale: float,
           q_rope: torch.Tensor | None = None, k_rope: torch.Tensor | None = None,
           sink: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """q [N, sq, D], k [KV_N, skv, D], v [KV_N, skv, Dv], visible [sq, skv] -> out [N, sq, Dv], lse [N, sq]."""
    group = q.shape[0] // k.shape[0]  # query head h reads kv head h // group (GQA)
    k = k.double().repeat_interleave(group, dim=0)
    v = v.double().repeat_interleave(group, dim=0)
    scores = q.double() @ k.transpose(1, 2)
    if q_rope is not None:
        scores = scores + q_rope.double() @ k_rope.double().repeat_interleave(group, dim=0).transpose(1, 2)
    scores = (scores * scale).masked_fill(~visible, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True) if scores.shape[-1] else scores.new_full((*scores.shape[:2], 1),
                                                                                           float("-inf"))
    if sink is not None:
        row_max = torch.maximum(row_max, sink.double().view(-1, 1, 1).expand_as(row_max))
    anchor = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(scores - anchor)
    denominator = weights.sum(dim=-1, keepdim=True)
    if sink is not None:
        denominator = denominator + torch.exp(sink.double().view(-1, 1, 1) - anchor)
    out = torch.where(denominator > 0, (weights @ v) / denominator.clamp_min(1e-300), torch.zeros(()).double())
    lse = (anchor + torch.log(denominator)).squeeze(-1)
    return out, lse
