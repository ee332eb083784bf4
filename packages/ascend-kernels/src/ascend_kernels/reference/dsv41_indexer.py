"""Reference ops of DeepSeek V4.1's two-level index selection: the candidate source layer keeps each row's best blocks
of compressed positions (the newest block always), later index sources mask their logits outside those blocks before
their own top-k. Contracts in `ascend_kernels.ops_dsv41`.
"""

from __future__ import annotations

import torch


def _bounds(row_ks, row_ke, rows: int, row_repeat: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row (start, end) in packed column space; rows share the bounds of their group of row_repeat."""
    group = torch.arange(rows, device=device) // row_repeat
    end = row_ke.reshape(-1).long().index_select(0, group)
    start = torch.zeros_like(end) if row_ks is None else row_ks.reshape(-1).long().index_select(0, group)
    return start, end


def dsv41_select_candidate_blocks(logits, row_ks, row_ke, topk_blocks: int, block_size: int, out,
                                  row_repeat: int = 1) -> None:
    rows, width = logits.shape
    if rows == 0:
        return
    if width == 0:
        out.fill_(-1)
        return
    nblocks = -(-width // block_size)
    start, end = _bounds(row_ks, row_ke, rows, row_repeat, logits.device)
    cols = start.unsqueeze(1) + torch.arange(nblocks * block_size, device=logits.device)
    inside = (cols < end.unsqueeze(1)) & (cols < width)
    values = logits.gather(1, cols.clamp(0, width - 1))
    values = torch.where(inside, values, torch.full_like(values, float("-inf")))
    scores = values.view(rows, nblocks, block_size).amax(-1)  # NaN propagates, as upstream's reduction
    newest = ((end - start - 1).div(block_size, rounding_mode="floor")).unsqueeze(1)
    pinned = (end > start).unsqueeze(1) & (torch.arange(nblocks, device=logits.device) == newest)
    scores = torch.where(pinned, torch.full_like(scores, float("inf")), scores)
    top = scores.topk(min(topk_blocks, nblocks), dim=-1)
    ids = torch.where(top.values != float("-inf"), top.indices, torch.full_like(top.indices, -1))
    out[:, :topk_blocks] = -1
    out[:, : ids.shape[1]] = ids.to(out.dtype)


def dsv41_apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size: int,
                               row_repeat: int = 1) -> None:
    rows, width = logits.shape
    if rows == 0 or width == 0:
        return
    nblocks = -(-width // block_size)
    start, end = _bounds(row_ks, row_ke, rows, row_repeat, logits.device)
    blocks = candidate_blocks[:rows].long()
    # a candidate starting past the logits' width lands on the extra flag `nblocks`, which keeps the last column
    beyond = start.unsqueeze(1) + blocks * block_size >= width
    blocks = torch.where(beyond, torch.full_like(blocks, nblocks), blocks)
    flags = torch.zeros(rows, nblocks + 2, dtype=torch.bool, device=logits.device)
    flags.scatter_(1, torch.where(blocks >= 0, blocks, nblocks + 1), True)  # column nblocks + 1: the -1 padding
    col = torch.arange(width, device=logits.device).unsqueeze(0)
    valid = (col >= start.unsqueeze(1)) & (col < end.unsqueeze(1))
    block = ((col - start.unsqueeze(1)).div(block_size, rounding_mode="floor")).clamp(0, nblocks - 1)
    keep = flags.gather(1, block) | ((col == width - 1) & flags[:, nblocks: nblocks + 1])
    logits.masked_fill_(~(valid & keep), float("-inf"))
