"""Where DeepSeek V4's paged caches keep a request's rows: positions, request-local indices and global slots.

Plain torch over the batch's metadata tensors; vLLM computes the same quantities with Triton kernels
(`vllm/v1/attention/ops/metadata.py`, `backends/mla/compressor_utils.py`), which have no backend here.
"""

from __future__ import annotations

import torch


def token_requests(query_start_loc: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """int32 `[num_tokens]`: the request each scheduled token belongs to (0 for padding past the last request)."""
    query_lens = (query_start_loc[1:] - query_start_loc[:-1]).to(torch.int64)
    owners = torch.repeat_interleave(torch.arange(query_lens.numel(), device=query_lens.device), query_lens)
    out = torch.zeros(num_tokens, dtype=torch.int32, device=query_start_loc.device)
    n = min(num_tokens, owners.numel())
    out[:n] = owners[:n].to(torch.int32)
    return out


def token_positions(query_start_loc: torch.Tensor, seq_lens: torch.Tensor, requests: torch.Tensor) -> torch.Tensor:
    """int64 `[num_tokens]`: each token's position in its request (its query starts at seq_len - query_len)."""
    req = requests.to(torch.int64)
    query_lens = query_start_loc[1:] - query_start_loc[:-1]
    first = (seq_lens - query_lens).to(torch.int64)
    offset = torch.arange(req.numel(), device=req.device) - query_start_loc[req].to(torch.int64)
    return first[req] + offset


def requests_and_positions(common_attn_metadata) -> tuple[torch.Tensor, torch.Tensor]:
    """Each scheduled token's request and position, from a step's common attention metadata."""
    cm = common_attn_metadata
    requests = token_requests(cm.query_start_loc, cm.num_actual_tokens)
    return requests, token_positions(cm.query_start_loc, cm.seq_lens, requests)


def paged_slots(local: torch.Tensor, requests: torch.Tensor, block_table: torch.Tensor,
                block_size: int) -> torch.Tensor:
    """int64 global slots of request-local row indices `local` `[tokens, k]` (-1 stays -1): row i of request r
    lives in block `block_table[r, i // block_size]` at offset `i % block_size`."""
    valid = local >= 0
    index = local.clamp(min=0).to(torch.int64)
    rows = requests.to(torch.int64).unsqueeze(-1).expand_as(index)
    blocks = block_table.to(torch.int64)[rows, torch.div(index, block_size, rounding_mode="floor")]
    return torch.where(valid, blocks * block_size + index % block_size, torch.full_like(index, -1))


def window_positions(positions: torch.Tensor, window: int) -> torch.Tensor:
    """`[tokens, window]` positions a token's sliding window covers (itself and the window - 1 before it), -1 where
    the window reaches before position 0."""
    offsets = torch.arange(window, device=positions.device) - (window - 1)
    covered = positions.to(torch.int64).unsqueeze(-1) + offsets
    return torch.where(covered >= 0, covered, torch.full_like(covered, -1))


def compressed_slot_mapping(positions: torch.Tensor, slot_mapping: torch.Tensor, requests: torch.Tensor,
                            block_table: torch.Tensor, states_per_block: int, ratio: int) -> torch.Tensor:
    """int64 `[tokens]`: where each token writes the compressed state it completes. Every `ratio` tokens share one
    state, written by the last of them; the others, and tokens with no slot of their own (padding), get -1."""
    state = torch.div(positions, ratio, rounding_mode="floor")
    slots = paged_slots(state.unsqueeze(-1), requests, block_table.clamp(min=0), states_per_block).squeeze(-1)
    completes = ((positions + 1) % ratio == 0) & (slot_mapping[: positions.numel()] >= 0)
    return torch.where(completes, slots, torch.full_like(slots, -1))
