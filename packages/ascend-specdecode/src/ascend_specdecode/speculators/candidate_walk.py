"""DFlash2's greedy candidate walk, scoring only the edges the walk reads.

Upstream (`DFlash2Speculator._generate_draft`) scores every edge of a draft block before walking it: per request and
draft step a ``top_k x top_k`` matrix (`_score_edges`: predecessor candidate p -> candidate c, a rank-r dot product
each), then `_selector_walk_kernel` reads one row of each step's matrix, the row of the candidate chosen at the step
before (at step 0 every row is the anchor's). The other ``top_k - 1`` rows are computed and thrown away: the work is
``steps * top_k**2 * rank`` per request where the walk needs ``steps * top_k * rank``. A checkpoint whose top-k is its
whole vocabulary (the tiny self-draft: 1000 x 1000 edges x rank 64 per step) spends three times the target's decode
step on those rows on a CPU.

`walk_greedy` scores the walked rows only, one step after the other: the same element-wise products and the same
einsum contraction as `_score_edges` (with a predecessor axis of one), then the choice the kernel makes at
temperature 0 (argmax, the first index on ties). Sampled drafts (``draft_sample_method="probabilistic"``) keep
upstream's path, since their Gumbel draw is the kernel's. No host synchronisation: the loop runs inside a captured
draft graph as well.
"""

from __future__ import annotations

from typing import Any

import torch


def walk_greedy(selector: Any, candidate_ids: torch.Tensor, unary_logits: torch.Tensor,
                hidden_states: torch.Tensor, anchor_token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The greedy walk over `candidate_ids` ``[n, steps, k]``: (chosen tokens ``[n, steps]``, the score row each
    step chose from ``[n, steps, k]``, what the kernel stores as realised scores).

    `selector` is the draft's `CandidateSelector` (its hidden projection and codebooks), `unary_logits` is
    ``[n, steps, k]``, `hidden_states` ``[n, steps, hidden]``, `anchor_token_ids` ``[n]`` (each block's bonus token).
    """
    hidden = selector.hidden_projection(hidden_states)
    predecessor_codes, successor_codes = selector.predecessor_codebook, selector.successor_codebook
    previous = anchor_token_ids
    tokens, rows = [], []
    for step in range(candidate_ids.shape[1]):
        candidates = candidate_ids[:, step]
        query = (predecessor_codes[previous] * hidden[:, step])[:, None, None]
        edges = torch.einsum("blpr,blcr->blpc", query, successor_codes[candidates][:, None])[:, 0, 0]
        row = unary_logits[:, step] + edges
        previous = candidates.gather(1, row.argmax(dim=-1, keepdim=True)).squeeze(1)
        tokens.append(previous)
        rows.append(row)
    return torch.stack(tokens, dim=1), torch.stack(rows, dim=1)
