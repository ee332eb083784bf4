"""The one place that calls `ascend_kernels.ops.rejection_sample`, converting from the layouts vLLM's verifiers use.

vLLM V1 flattens the drafts of all requests (request r owns rows ``[cu[r-1], cu[r])``) and expects
``[batch, max_spec_len + 1]`` int32 output with -1 padding. Model Runner V2 gives every request one logits row per
draft plus its bonus row (request r owns rows ``[cu[r], cu[r+1])``; row ``cu[r] + i`` scores draft i, the input
token of row ``cu[r] + i + 1``) and expects ``[batch, max_spec_len + 1]`` int64 tokens with a count per request.
The kernel takes drafts padded per request (``[batch, K]`` with -1) and target scores ``[batch, K, vocab]``. The
decision itself (accept while the draft is the target's choice or passes ``u * q(x) < p(x)``; then the recovered or
bonus token) is the kernel's.
"""

from __future__ import annotations

import torch

PLACEHOLDER = -1


def _padded_rows(cu_num_draft_tokens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request, column) of every flattened draft row."""
    ends = cu_num_draft_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    rows = torch.repeat_interleave(torch.arange(counts.shape[0], device=ends.device), counts)
    cols = torch.arange(total, device=ends.device) - (ends - counts)[rows]
    return rows, cols


def _pad(flat: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor, batch: int, k: int, fill: float) -> torch.Tensor:
    out = flat.new_full((batch, k, *flat.shape[1:]), fill)
    out[rows, cols] = flat
    return out


def verify(
    draft_token_ids: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    max_spec_len: int,
    draft_probs: torch.Tensor | None,
    target: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    *,
    temperature: torch.Tensor | None = None,
    target_is_probs: bool = False,
) -> torch.Tensor:
    """Rejection-sample flattened drafts with `ascend_kernels`; ``[batch, max_spec_len + 1]`` int32, -1 padded.

    `target` is ``[num_drafts, vocab]`` logits (greedy: temperature None) or final probabilities
    (`target_is_probs`, with `temperature` only marking greedy rows).
    """
    from ascend_kernels.ops import rejection_sample

    batch = cu_num_draft_tokens.shape[0]
    rows, cols = _padded_rows(cu_num_draft_tokens, draft_token_ids.shape[0])
    drafts = _pad(draft_token_ids.to(torch.int64), rows, cols, batch, max_spec_len, PLACEHOLDER)
    scores = _pad(target, rows, cols, batch, max_spec_len, 0.0)
    q = None if draft_probs is None else _pad(draft_probs, rows, cols, batch, max_spec_len, 0.0)
    out, _ = rejection_sample(
        drafts,
        q,
        scores,
        bonus_token_ids.reshape(batch).to(torch.int64),
        temperature=temperature,
        target_is_probs=target_is_probs,
    )
    return out.to(torch.int32)


def greedy_verify(
    draft_token_ids: torch.Tensor,
    target_logits: torch.Tensor,
    cu_num_draft_tokens: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    max_spec_len: int,
) -> torch.Tensor:
    """Greedy verification: the longest prefix of drafts equal to the target's argmax, then its argmax or the bonus."""
    return verify(draft_token_ids, cu_num_draft_tokens, max_spec_len, None, target_logits, bonus_token_ids)


def greedy_verify_rows(
    target_logits: torch.Tensor,
    row_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    max_spec_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verification in Model Runner V2's layout: ``(tokens [batch, max_spec_len + 1] int64, counts int32)``.

    `row_tokens[j]` is the input token of logits row j, so request r's drafts are ``row_tokens[cu[r] + 1 :
    cu[r + 1]]``. A negative draft is a placeholder: it and every later draft of the request are rejected, the
    request then takes the target's argmax at that row (its "bonus" for the kernel). Counts include that token.
    """
    from ascend_kernels.ops import rejection_sample, sample_greedy

    cu = cu_num_logits.to(torch.int64)
    batch = cu.shape[0] - 1
    num_drafts = (cu[1:] - cu[:-1] - 1).clamp(min=0)
    drafts = torch.full((batch, max_spec_len), PLACEHOLDER, dtype=torch.int64, device=target_logits.device)
    total = int(num_drafts.sum())
    if total:
        rows, cols = _padded_rows(torch.cumsum(num_drafts, 0), total)
        drafts[rows, cols] = row_tokens[cu[:-1][rows] + cols + 1].to(torch.int64)
        drafts = torch.where(torch.cumprod((drafts >= 0).long(), dim=1).bool(), drafts, PLACEHOLDER)
    usable = (drafts >= 0).sum(dim=1)
    first_rows = cu[:-1]
    index = first_rows[:, None] + torch.arange(max_spec_len, device=cu.device)[None, :]
    index = torch.minimum(index, (cu[1:] - 1).clamp(min=0)[:, None])
    scores = target_logits[index]  # rows past a request's drafts are ignored by the kernel
    bonus = sample_greedy(target_logits[first_rows + usable])
    tokens, accepted = rejection_sample(drafts, None, scores, bonus)
    return tokens, (accepted + 1).to(torch.int32)
