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

from collections.abc import Mapping, Sequence

import torch

PLACEHOLDER = -1
# (seed, position) -> one torch generator seed: an odd 64-bit multiplier spreads nearby seeds apart.
_SEED_MIX = 0x9E3779B97F4A7C15
_GENERATOR_SEEDS = 2**63


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


def _rejection_groups(
    batch: int, generators: Mapping[int, torch.Generator] | None, device: torch.device
) -> list[tuple[torch.Tensor, torch.Generator | None]]:
    """(rows, generator) calls covering a batch: the rows without a generator of their own in one call on the
    default stream, then each seeded row alone with its generator, so a seeded request's draws never depend on what
    else is in its batch."""
    own = sorted(generators or {})
    if not own:
        return [(torch.arange(batch, device=device), None)]
    shared = [r for r in range(batch) if r not in set(own)]
    groups: list[tuple[torch.Tensor, torch.Generator | None]] = []
    if shared:
        groups.append((torch.tensor(shared, device=device), None))
    groups += [(torch.tensor([r], device=device), generators[r]) for r in own]  # type: ignore[index]
    return groups


def _sample_in_groups(
    drafts: torch.Tensor,
    q: torch.Tensor | None,
    scores: torch.Tensor,
    bonus: torch.Tensor,
    temperature: torch.Tensor | None,
    target_is_probs: bool,
    generators: Mapping[int, torch.Generator] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    from ascend_kernels.ops import rejection_sample

    groups = _rejection_groups(drafts.shape[0], generators, drafts.device)
    if len(groups) == 1:
        return rejection_sample(
            drafts, q, scores, bonus, temperature=temperature, target_is_probs=target_is_probs, generator=groups[0][1]
        )
    out = drafts.new_full((drafts.shape[0], drafts.shape[1] + 1), PLACEHOLDER)
    accepted = drafts.new_zeros(drafts.shape[0])
    for rows, generator in groups:
        o, a = rejection_sample(
            drafts[rows],
            None if q is None else q[rows],
            scores[rows],
            bonus[rows],
            temperature=None if temperature is None else temperature[rows],
            target_is_probs=target_is_probs,
            generator=generator,
        )
        out[rows], accepted[rows] = o, a
    return out, accepted


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
    generators: Mapping[int, torch.Generator] | None = None,
) -> torch.Tensor:
    """Rejection-sample flattened drafts with `ascend_kernels`; ``[batch, max_spec_len + 1]`` int32, -1 padded.

    `target` is ``[num_drafts, vocab]`` logits (greedy: temperature None) or final probabilities
    (`target_is_probs`, with `temperature` only marking greedy rows). `generators` (request index -> generator,
    vLLM V1's per-request seeds) draws those requests' acceptance and recovery noise from their own generators.
    """
    batch = cu_num_draft_tokens.shape[0]
    rows, cols = _padded_rows(cu_num_draft_tokens, draft_token_ids.shape[0])
    drafts = _pad(draft_token_ids.to(torch.int64), rows, cols, batch, max_spec_len, PLACEHOLDER)
    scores = _pad(target, rows, cols, batch, max_spec_len, 0.0)
    q = None if draft_probs is None else _pad(draft_probs, rows, cols, batch, max_spec_len, 0.0)
    out, _ = _sample_in_groups(
        drafts, q, scores, bonus_token_ids.reshape(batch).to(torch.int64), temperature, target_is_probs, generators
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


def _rows_padded(
    target_logits: torch.Tensor, row_tokens: torch.Tensor, cu: torch.Tensor, max_spec_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Model Runner V2's rows as the kernel's padded layout: (drafts ``[batch, K]`` with -1 from the first
    placeholder on, scores ``[batch, K, vocab]``, usable drafts per request, each request's first row)."""
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
    return drafts, target_logits[index], usable, first_rows  # rows past a request's drafts are ignored by the kernel


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

    drafts, scores, usable, first_rows = _rows_padded(
        target_logits, row_tokens, cu_num_logits.to(torch.int64), max_spec_len
    )
    bonus = sample_greedy(target_logits[first_rows + usable])
    tokens, accepted = rejection_sample(drafts, None, scores, bonus)
    return tokens, (accepted + 1).to(torch.int32)


def sampled_verify_rows(
    target_logits: torch.Tensor,
    row_tokens: torch.Tensor,
    cu_num_logits: torch.Tensor,
    positions: torch.Tensor,
    max_spec_len: int,
    *,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    explicit_seed: Sequence[bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling in Model Runner V2's layout for a batch with sampled requests (greedy ones may be mixed
    in): `target_logits` are the processed logits (temperature, top-k/top-p already applied: their softmax is the
    target distribution), drafts deterministic (MRV2's default greedy drafting: q is one-hot).

    The bonus token (every draft accepted, or the row after a placeholder) is drawn like MRV2's sampler draws a
    token, by `ascend_kernels.ops.gumbel_sample` over (seed, position). The acceptance and recovery draws of a
    request with an explicit seed come from a generator keyed by (seed, its first row's position), so a seeded
    request repeats whatever else is in its batch; the others share the default stream. Per request,
    ``temperature[r] == 0`` makes the row greedy. Returns ``(tokens [batch, max_spec_len + 1] int64, counts int32)``.
    """
    from ascend_kernels.ops import gumbel_sample

    cu = cu_num_logits.to(torch.int64)
    drafts, scores, usable, first_rows = _rows_padded(target_logits, row_tokens, cu, max_spec_len)
    bonus_rows = first_rows + usable
    temperature = temperature.to(device=target_logits.device, dtype=torch.float32)
    seeds = seeds.to(device=target_logits.device, dtype=torch.int64)
    bonus = gumbel_sample(
        target_logits[bonus_rows], temperature, seeds, positions[bonus_rows].to(torch.int64), apply_temperature=False
    )
    probs = scores.float().softmax(dim=-1)
    generators: dict[int, torch.Generator] = {}
    first_positions = positions[first_rows].tolist()
    for r, seeded in enumerate(explicit_seed):
        if seeded:
            key = (int(seeds[r]) * _SEED_MIX + int(first_positions[r])) % _GENERATOR_SEEDS
            generators[r] = torch.Generator(device=target_logits.device).manual_seed(key)
    tokens, accepted = _sample_in_groups(drafts, None, probs, bonus, temperature, True, generators)
    return tokens, (accepted + 1).to(torch.int32)
