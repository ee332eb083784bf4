"""Moving expert weights between expert-parallel ranks when a layer's placement changes.

Every rank knows both placements, so each one works out alone what it keeps, what it receives and from whom, and
what it sends: an expert a rank already holds is copied locally; otherwise the lowest rank holding it in the old
placement sends it (point-to-point over the EP group, tag = destination row). All of a layer's weight tensors of an
expert travel as one packed message. The new rows are assembled aside and copied into the parameters at the end,
in place, so the tensors the model holds keep their identity.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class MovePlan:
    local_copies: list[tuple[int, int]]  # (new row, old row) on this rank
    receives: list[tuple[int, int]]  # (new row, source EP rank)
    sends: list[tuple[int, int, int]]  # (old row, destination EP rank, destination row)


def plan_moves(old: Sequence[int], new: Sequence[int], *, ep_rank: int, ep_size: int) -> MovePlan:
    slots = len(old) // ep_size

    def rows(placement: Sequence[int], rank: int) -> list[int]:
        return list(placement[rank * slots:(rank + 1) * slots])

    def source(expert: int) -> int:
        return next(r for r in range(ep_size) if expert in rows(old, r))

    mine_old = rows(old, ep_rank)
    copies, receives, sends = [], [], []
    for row, expert in enumerate(rows(new, ep_rank)):
        if expert in mine_old:
            copies.append((row, mine_old.index(expert)))
        else:
            receives.append((row, source(expert)))
    for dst in range(ep_size):
        if dst == ep_rank:
            continue
        dst_old = rows(old, dst)
        for row, expert in enumerate(rows(new, dst)):
            if expert not in dst_old and source(expert) == ep_rank:
                sends.append((mine_old.index(expert), dst, row))
    return MovePlan(copies, receives, sends)


def _pack(weights: Sequence[torch.Tensor], row: int) -> torch.Tensor:
    return torch.cat([w[row].reshape(-1) for w in weights])


def _unpack_into(weights: Sequence[torch.Tensor], row: int, flat: torch.Tensor) -> None:
    start = 0
    for w in weights:
        n = w[row].numel()
        w[row].copy_(flat[start:start + n].view_as(w[row]))
        start += n


def move_expert_weights(weights: Sequence[torch.Tensor], plan: MovePlan, *, group: dist.ProcessGroup,
                        global_ranks: Sequence[int]) -> int:
    """Apply `plan` to `weights` (each `[rows, ...]`, rows = slots per rank); returns the experts received."""
    new = [torch.empty_like(w) for w in weights]
    for row, old_row in plan.local_copies:
        for w, n in zip(weights, new, strict=True):
            n[row].copy_(w[old_row])
    row_numel = sum(w[0].numel() for w in weights)
    dtype = weights[0].dtype
    if any(w.dtype != dtype for w in weights):
        raise TypeError(f"expert weights of one layer must share a dtype to travel packed, got "
                        f"{sorted({str(w.dtype) for w in weights})}")
    inbox = [(row, torch.empty(row_numel, dtype=dtype, device=weights[0].device)) for row, _ in plan.receives]
    requests = [dist.irecv(buf, src=global_ranks[src], group=group, tag=row)
                for (row, src), (_, buf) in zip(plan.receives, inbox, strict=True)]
    outbox = [_pack(weights, old_row) for old_row, _, _ in plan.sends]
    requests += [dist.isend(buf, dst=global_ranks[dst], group=group, tag=dst_row)
                 for (_, dst, dst_row), buf in zip(plan.sends, outbox, strict=True)]
    for request in requests:
        request.wait()
    for row, buf in inbox:
        _unpack_into(new, row, buf)
    for w, n in zip(weights, new, strict=True):
        w.copy_(n)
    return len(plan.receives)
