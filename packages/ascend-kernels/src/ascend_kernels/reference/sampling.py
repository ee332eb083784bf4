"""Token sampling (reference): greedy, the top-k / top-p filter, and the exponential race the rejection sampler draws
with.

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


def _drop_below_top_p(ordered: torch.Tensor, top_p) -> torch.Tensor:
    """`ordered` ascending per row; -inf for the tokens outside the smallest most-likely set of mass >= top_p."""
    if top_p is None:
        return ordered
    mass_below = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
    drop = mass_below <= (1.0 - top_p.float())[:, None]
    drop[:, -1] = False  # keep at least the most likely token
    return ordered.masked_fill(drop, float("-inf"))


def apply_top_k_top_p(logits: torch.Tensor, top_k, top_p) -> torch.Tensor:
    """logits `[rows, vocab]` float32 with the tokens outside top-k, then outside top-p, set to -inf."""
    if top_k is None and top_p is None:
        return logits
    vocab = logits.shape[-1]
    if top_k is not None:
        k = top_k.long()
        k = torch.where((k <= 0) | (k >= vocab), torch.full_like(k, vocab), k)
        kmax = int(k.max())
        values, ids = logits.topk(kmax, dim=-1)  # only these can survive top-k: no full sort
        kth = values.gather(-1, (k - 1)[:, None])
        if top_p is None:
            return logits.masked_fill(logits < kth, float("-inf"))  # ties at the k-th logit stay
        if kmax < vocab and int((logits >= kth).sum(dim=-1).max()) <= kmax:  # no tie spills past the candidates
            ordered = values.flip(-1)
            ordered = _drop_below_top_p(ordered.masked_fill(ordered < kth, float("-inf")), top_p)
            return torch.full_like(logits, float("-inf")).scatter_(-1, ids.flip(-1), ordered)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    ordered, order = logits.sort(dim=-1)  # ascending: the most likely last
    return torch.empty_like(logits).scatter_(-1, order, _drop_below_top_p(ordered, top_p))


def exponential_race(probs: torch.Tensor, generator) -> torch.Tensor:
    """One index per row of `probs [..., vocab]` (non-negative, not necessarily normalised), sampled ∝ probs."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return (probs / noise).argmax(dim=-1)


def sample_greedy(logits):
    return logits.argmax(dim=-1)


def top_k_top_p(logits, top_k=None, top_p=None):
    """The facade's sampling filter: `apply_top_k_top_p` in the logits' own dtype."""
    if top_k is None and top_p is None:
        return logits
    return apply_top_k_top_p(logits.float(), top_k, top_p).to(logits.dtype)
