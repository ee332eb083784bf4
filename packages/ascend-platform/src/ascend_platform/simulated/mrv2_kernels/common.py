"""Helpers for kernel stand-ins: kernels address their pointer arguments as flat element arrays."""

from __future__ import annotations

import torch


def flat(t: torch.Tensor) -> torch.Tensor:
    """`t` as the kernel sees a pointer: a flat view of its elements (never a copy, so writes land in `t`)."""
    if not t.is_contiguous():
        raise ValueError(f"kernel stand-in got a non-contiguous tensor {tuple(t.shape)}/{t.stride()} where the "
                         "Triton kernel assumes a dense pointer")
    return t.view(-1)


def rows_of(counts: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For segments of the given lengths: each element's segment index and its offset inside the segment."""
    n = counts.shape[0]
    seg = torch.repeat_interleave(torch.arange(n, device=counts.device), counts, output_size=total)
    starts = torch.cumsum(counts, 0) - counts
    return seg, torch.arange(total, device=counts.device) - starts[seg]


def unpack_bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """int32 words `[rows, words]` -> bool `[rows, width]`: bit i of word w stands for entry 32 * w + i."""
    bits = (packed.long()[..., None] >> torch.arange(32, device=packed.device)) & 1
    return bits.view(packed.shape[0], -1)[:, :width].bool()
