"""Speculative-decoding rejection sampler (reference); the contract is `ascend_kernels.ops.rejection_sample`'s.

Vectorised over requests and draft positions: the accept test, the residual distribution and a recovered token are
computed for every position at once, and the first rejection per request is found with a cumulative product.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.sampling import SAMPLING_EPS, apply_top_k_top_p, exponential_race, per_row


def _target_probs(target, temperature, top_k, top_p, target_is_probs):
    b, k, vocab = target.shape
    if temperature is None:
        greedy = torch.ones(b, dtype=torch.bool, device=target.device)
    else:
        temp = per_row(temperature, b, target.device)
        greedy = temp < SAMPLING_EPS
    if target_is_probs:
        probs = target.float()
    else:
        scale = torch.ones(b, device=target.device) if temperature is None else torch.where(greedy, 1.0, temp)
        scaled = (target.float() / scale[:, None, None]).reshape(b * k, vocab)
        rep_k = None if top_k is None else top_k.repeat_interleave(k)
        rep_p = None if top_p is None else top_p.repeat_interleave(k)
        probs = torch.softmax(apply_top_k_top_p(scaled, rep_k, rep_p), dim=-1).view(b, k, vocab)
    one_hot = torch.zeros_like(probs).scatter_(-1, target.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None, None], one_hot, probs)


def rejection_sample(
    draft_token_ids,
    draft_probs,
    target_logits,
    bonus_token_ids,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    generator=None,
    target_is_probs=False,
):
    b, k = draft_token_ids.shape
    device = draft_token_ids.device
    bonus = bonus_token_ids.reshape(b).long()
    output = torch.full((b, k + 1), -1, dtype=torch.long, device=device)
    if k == 0 or b == 0:
        output[:, 0] = bonus
        return output, torch.zeros(b, dtype=torch.long, device=device)
    draft = draft_token_ids.long()
    valid = torch.cumprod((draft >= 0).long(), dim=1).bool()  # a request's drafts are its leading entries >= 0
    tokens = draft.clamp(min=0)
    p = _target_probs(target_logits, temperature, top_k, top_p, target_is_probs)
    p_x = p.gather(-1, tokens[..., None]).squeeze(-1)
    # A deterministic drafter put probability 1 on its token.
    q = torch.zeros_like(p).scatter_(-1, tokens[..., None], 1.0) if draft_probs is None else draft_probs.float()
    q_x = q.gather(-1, tokens[..., None]).squeeze(-1)
    u = torch.rand(b, k, device=device, generator=generator)
    accepted = (u * q_x < p_x) & valid
    num_accepted = torch.cumprod(accepted.long(), dim=1).sum(dim=1)
    num_drafts = valid.sum(dim=1)

    residual = (p - q).clamp_(min=0.0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p)
    recovered = exponential_race(residual, generator)  # [b, k]: the replacement if position k is rejected

    positions = torch.arange(k, device=device)
    output[:, :k] = torch.where(positions[None, :] < num_accepted[:, None], draft, -1)
    at_stop = recovered.gather(1, num_accepted.clamp(max=k - 1)[:, None]).squeeze(1)
    final = torch.where(num_accepted < num_drafts, at_stop, bonus)
    output.scatter_(1, num_accepted[:, None], final[:, None])
    return output, num_accepted
