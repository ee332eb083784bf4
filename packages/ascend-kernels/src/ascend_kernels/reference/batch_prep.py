"""Slot mapping for paged KV writes (reference): each scheduled token's cache slot from its request's block table.

One vectorised pass over the batch's tokens: a token's batch row comes from searching the query boundaries, its
block from the row's block table. The reference reads the token count back from the device (`query_start_loc[-1]`),
which costs nothing on the CPU.
"""

from __future__ import annotations

import torch

PAD_SLOT = -1


def compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size, *, out):
    num_reqs = req_indices.shape[0]
    num_tokens = int(query_start_loc[num_reqs]) if num_reqs else 0
    out[num_tokens:].fill_(PAD_SLOT)
    if num_tokens == 0:
        return out
    token_ids = torch.arange(num_tokens, device=out.device, dtype=query_start_loc.dtype)
    rows = torch.searchsorted(query_start_loc[1 : num_reqs + 1].contiguous(), token_ids, right=True)
    reqs = req_indices.long()[rows]
    pos = positions[:num_tokens].long()
    blocks = block_table[reqs.clamp(min=0), torch.div(pos, block_size, rounding_mode="floor")].long()
    slots = blocks * block_size + pos % block_size
    out[:num_tokens] = torch.where(reqs >= 0, slots, torch.full_like(slots, PAD_SLOT))
    return out
