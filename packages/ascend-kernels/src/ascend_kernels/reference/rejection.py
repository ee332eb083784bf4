"""Speculative-decoding rejection sampler (reference); the contract is `ascend_kernels.ops.rejection_sample`'s.

Vectorised over requests and draft positions: the accept test reads only p(x) and q(x) at each draft token, and the
first rejection per request is found with a cumulative product. The residual distribution is then built and drawn
from only at each request's stop position (one `[requests, vocab]` row each): the other positions' replacements are
never used, and building and racing all `[requests, K, vocab]` of them was most of the op's time (the exponential
noise alone ~40 %, benchmarks/kernels.py's 16 x 4 x 32,000 case).
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.sampling import SAMPLING_EPS, apply_top_k_top_p, exponential_race, per_row


def _greedy_rows(target, temperature):
    b = target.shape[0]
    if temperature is None:
        return torch.ones(b, dtype=torch.bool, device=target.device)
    return per_row(temperature, b, target.device) < SAMPLING_EPS


def _target_probs(target, greedy, temperature, top_k, top_p, target_is_probs):
    """p `[b, K, vocab]` float32 for the sampled rows (greedy rows are replaced by one-hot rows where read)."""
    b, k, vocab = target.shape
    if target_is_probs:
        return target.float()
    scaled = target.float()
    if temperature is not None:
        scale = torch.where(greedy, 1.0, per_row(temperature, b, target.device))
        if not bool((scale == 1.0).all()):  # dividing by one is a full pass for nothing
            scaled = scaled / scale[:, None, None]
    if top_k is not None or top_p is not None:
        rep_k = None if top_k is None else top_k.repeat_interleave(k)
        rep_p = None if top_p is None else top_p.repeat_interleave(k)
        scaled = apply_top_k_top_p(scaled.reshape(b * k, vocab), rep_k, rep_p).view(b, k, vocab)
    return torch.softmax(scaled, dim=-1)


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
    vocab = target_logits.shape[-1]
    draft = draft_token_ids.long()
    valid = torch.cumprod((draft >= 0).long(), dim=1).bool()  # a request's drafts are its leading entries >= 0
    tokens = draft.clamp(min=0)
    greedy = _greedy_rows(target_logits, temperature)
    all_greedy = bool(greedy.all())
    # Greedy rows: p is one-hot at the target's argmax.
    best = target_logits.argmax(dim=-1) if bool(greedy.any()) else None  # [b, K]
    p = None if all_greedy else _target_probs(target_logits, greedy, temperature, top_k, top_p, target_is_probs)
    p_x = torch.zeros(b, k, device=device) if p is None else p.gather(-1, tokens[..., None]).squeeze(-1)
    if best is not None:
        p_x = torch.where(greedy[:, None], (tokens == best).float(), p_x)
    # A deterministic drafter put probability 1 on its token.
    q_x = torch.ones(b, k, device=device) if draft_probs is None else draft_probs.gather(-1, tokens[..., None])
    q_x = q_x.reshape(b, k).float()
    u = torch.rand(b, k, device=device, generator=generator)
    accepted = (u * q_x < p_x) & valid
    num_accepted = torch.cumprod(accepted.long(), dim=1).sum(dim=1)
    num_drafts = valid.sum(dim=1)

    # Each request's stop position (its first rejection; clamped where every draft was accepted and the row is unused).
    stop = num_accepted.clamp(max=k - 1)
    rows = torch.arange(b, device=device)
    p_row = torch.zeros(b, vocab, device=device) if p is None else p[rows, stop]
    if best is not None:
        one_hot = torch.zeros(b, vocab, device=device).scatter_(-1, best[rows, stop][:, None], 1.0)
        p_row = torch.where(greedy[:, None], one_hot, p_row)
    x_stop = tokens[rows, stop]
    if draft_probs is None:
        q_row = torch.zeros(b, vocab, device=device).scatter_(-1, x_stop[:, None], 1.0)
    else:
        q_row = draft_probs[rows, stop].float()
    residual = (p_row - q_row).clamp_(min=0.0)
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_row)
    recovered = exponential_race(residual, generator)  # [b]: the replacement at the stop position

    positions = torch.arange(k, device=device)
    output[:, :k] = torch.where(positions[None, :] < num_accepted[:, None], draft, -1)
    final = torch.where(num_accepted < num_drafts, recovered, bonus)
    output.scatter_(1, num_accepted[:, None], final[:, None])
    return output, num_accepted
