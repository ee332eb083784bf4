"""Slot mapping for paged KV writes (reference): each scheduled token's cache slot from its request's block table.

One vectorised pass over the batch's tokens. The reference reads the batch's query offsets back from the device once
(free on the CPU): a batch of one token per request (decode) then maps token i to request i with no search, and any
other batch repeats each request's index over its tokens.
"""

from __future__ import annotations

import itertools

import torch

from ascend_kernels.reference import native_batch_prep

PAD_SLOT = -1


def compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size, *, out):
    if native_batch_prep.compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size, out):
        return out
    num_reqs = req_indices.shape[0]
    starts = query_start_loc[: num_reqs + 1].tolist() if num_reqs else [0]
    num_tokens = starts[-1]
    out[num_tokens:].fill_(PAD_SLOT)
    if num_tokens == 0:
        return out
    reqs = req_indices.long()
    if num_tokens != num_reqs or starts != list(range(num_reqs + 1)):
        counts = torch.tensor([b - a for a, b in itertools.pairwise(starts)], device=reqs.device)
        reqs = reqs.repeat_interleave(counts, output_size=num_tokens)
    pos = positions[:num_tokens].long()
    blocks = block_table[reqs.clamp(min=0), torch.div(pos, block_size, rounding_mode="floor")].long()
    slots = blocks.mul_(block_size).add_(pos % block_size)
    out[:num_tokens] = torch.where(reqs >= 0, slots, PAD_SLOT)
    return out
