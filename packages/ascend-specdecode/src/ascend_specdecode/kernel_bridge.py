"""The one place that calls the `ascend_kernels` rejection sampler, in the layout vLLM's V1 verifier uses.

Layout (upstream's): drafts of all requests flattened (request r owns ``[starts[r], ends[r])``); the output is
``[batch, max_spec_len + 1]`` with, per request, the target's token at every verified position up to and including
the first rejection, the bonus token when every draft was accepted, and -1 elsewhere.
"""

from __future__ import annotations

import torch

PLACEHOLDER = -1


def greedy_verify_reference(
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
) -> torch.Tensor:
    """Pure-torch greedy verification: accept the longest prefix of drafts equal to the target's argmax."""
    batch = starts.shape[0]
    device = target_argmax.device
    out = torch.full((batch, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    if batch == 0:
        return out
    cols = torch.arange(max_spec_len, device=device)
    n = (ends - starts).to(torch.int64)
    valid = cols[None, :] < n[:, None]
    total = draft_token_ids.shape[0]
    idx = (starts.to(torch.int64)[:, None] + cols[None, :]).clamp(max=max(total - 1, 0))
    drafts = draft_token_ids.to(torch.int64)[idx] if total else torch.zeros_like(idx)
    target = target_argmax.to(torch.int64)[idx] if total else torch.zeros_like(idx)
    match = (drafts == target) & valid
    accepted = torch.cumprod(match.to(torch.int64), dim=1).sum(dim=1)  # leading run of matches
    emit = cols[None, :] <= accepted[:, None]
    out[:, :max_spec_len] = torch.where(emit & valid, target, PLACEHOLDER).to(torch.int32)
    all_accepted = accepted == n
    rows = torch.nonzero(all_accepted).flatten()
    out[rows, n[rows]] = bonus_token_ids.reshape(-1)[rows].to(torch.int32)
    return out


def greedy_verify(
    draft_token_ids: torch.Tensor,
    target_argmax: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
) -> torch.Tensor:
    """Greedy verification through `ascend_kernels` (see `verifier_backend`)."""
    return greedy_verify_reference(draft_token_ids, target_argmax, starts, ends, bonus_token_ids, max_spec_len)


def verifier_backend() -> str:
    """Which implementation `greedy_verify` runs."""
    return "ascend_specdecode.kernel_bridge.greedy_verify_reference"
