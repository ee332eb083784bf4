"""Token sampling (reference): greedy, and temperature / top-k / top-p sampling by the exponential race.

Drawing `argmax(p / E)` with `E ~ Exp(1)` per token samples exactly from p without a cumulative-sum search and keeps
each row's randomness independent of the others.
"""

from __future__ import annotations

import torch

SAMPLING_EPS = 1e-5  # temperatures below this are greedy (vLLM's threshold)


def per_row(value, rows: int, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.float()
    return torch.full((rows,), float(value), device=device)


def apply_top_k_top_p(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """logits `[rows, vocab]` float32 with the tokens outside top-k, then outside top-p, set to -inf."""
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    if top_p is None:  # a k-th-largest threshold needs no full sort
        k = top_k.long()
        k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
        kth = logits.topk(int(k.max()), dim=-1).values.gather(-1, (k - 1)[:, None])
        return logits.masked_fill(logits < kth, float("-inf"))
    ordered, order = logits.sort(dim=-1)  # ascending: the most likely last
    if top_k is not None:
        k = top_k.long()
        k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
        kth = ordered.gather(-1, (vocab - k)[:, None])
        ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    if top_p is not None:
        mass_below = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        drop = mass_below <= (1.0 - top_p.float())[:, None]
        drop[:, -1] = False  # keep at least the most likely token
        ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def exponential_race(probs: torch.Tensor, generator) -> torch.Tensor:
    """One index per row of `probs [..., vocab]` (non-negative, not necessarily normalised), sampled ∝ probs."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def sample_greedy(logits):
    return logits.argmax(dim=-1)


def sample(logits, temperature, top_k=None, top_p=None, generator=None):
    rows = logits.shape[0]
    if rows == 0:
        return torch.empty(0, dtype=torch.long, device=logits.device)
    temp = per_row(temperature, rows, logits.device)
    greedy = temp < SAMPLING_EPS
    scaled = logits.float() / torch.where(greedy, torch.ones_like(temp), temp)[:, None]
    probs = torch.softmax(apply_top_k_top_p(scaled, top_k, top_p), dim=-1)
    return torch.where(greedy, logits.argmax(dim=-1), exponential_race(probs, generator))
