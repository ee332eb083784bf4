"""Paged K/V planes on torch_npu's paged kernels: a hybrid model's attention caches.

The allocator lays a hybrid's attention K and V out as paged planes (`ascend_core.kv.planes`): each block's K page
and V page sit inside the block's own page, beside the pages the state group (GDN / Mamba) owns, so each plane is a
`[num_blocks, block_size, heads, dim]` view whose blocks are one block stride apart, not one contiguous tensor. The
paged kernels take dense caches only, and the reference (what such a cache ran before) makes host round trips and
dozens of small launches per layer on a device. So instead:
- the cache write indexes the strided planes in place: one indexed copy per plane by (block, offset), padding slots
  sent to slot 0 of the null block as the dense write sends them, no read-back;
- attention copies the blocks the step's requests read into a dense workspace, consecutive requests at a time
  within `GATHER_BUDGET_BYTES`, and runs the kernel on each piece with its block table numbered 0..n-1.
The copy reads each context once more than a dense layout would: correct and on the device's kernels, at up to
about twice the attention's bytes. A dense layout beside the states is what removes it (docs/hybrid_models.md).
"""

from __future__ import annotations

import torch

# Gathered K and V bytes per kernel call; a request whose context alone is bigger gets a call of its own.
GATHER_BUDGET_BYTES = 256 << 20


def write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
          slots: torch.Tensor) -> None:
    """Scatter token rows into strided K/V planes by slot (`slots`: no negatives, see `npu_backend._kernel_slots`)."""
    slots = slots.long()
    block_size = key_cache.shape[1]
    blocks, offsets = torch.div(slots, block_size, rounding_mode="floor"), slots % block_size
    key_cache[blocks, offsets] = key.to(key_cache.dtype)
    value_cache[blocks, offsets] = value.to(value_cache.dtype)


def request_pieces(lens: list[int], block_size: int, block_bytes: int,
                   budget: int | None = None) -> list[tuple[int, int]]:
    """Consecutive request ranges `[r0, r1)` whose gathered blocks (each request padded to the piece's longest
    context) stay within `budget` (default GATHER_BUDGET_BYTES); a request over it alone is a piece of its own."""
    budget = GATHER_BUDGET_BYTES if budget is None else budget
    pieces: list[tuple[int, int]] = []
    start, widest = 0, 0
    for r, n in enumerate(lens):
        blocks = -(-n // block_size)
        grown = max(widest, blocks)
        if r > start and grown * (r - start + 1) * block_bytes > budget:
            pieces.append((start, r))
            start, grown = r, blocks
        widest = grown
    if lens:
        pieces.append((start, len(lens)))
    return pieces


def gather(key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor, r0: int, r1: int,
           blocks: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dense copies of the first `blocks` blocks of requests `[r0, r1)` and their table: `(k, v, table)`, k and v
    `[(r1 - r0) * blocks, block_size, heads, dim]` contiguous, table int32 `[r1 - r0, blocks]` numbering them."""
    ids = block_table[r0:r1, :blocks].reshape(-1).long().clamp(0, key_cache.shape[0] - 1)
    k = key_cache.index_select(0, ids)
    v = value_cache.index_select(0, ids)
    table = torch.arange(ids.numel(), dtype=torch.int32, device=block_table.device).view(r1 - r0, blocks)
    return k, v, table
