"""The rebalancing policy: from measured per-expert load to a new placement with redundant experts.

1. Replicas: every expert gets one slot; each spare slot goes to the expert whose per-replica load is then highest
   (replicas split an expert's tokens evenly, see `ExpertPlacement.physical_ids`).
2. Packing: replicas in decreasing per-replica load go to the least-loaded rank with a free slot, a rank holding
   no replica of that expert yet when one can (longest-processing-time first).
3. Slots: within a rank an expert keeps the row it had when the old placement put it on that rank, so data only
   moves for experts that change rank.

Deterministic (ties break by lower expert id / rank), so every rank computes the same placement from the same loads.
"""

from __future__ import annotations

from collections.abc import Sequence


def replica_counts(load: Sequence[float], num_slots: int) -> list[int]:
    if num_slots < len(load):
        raise ValueError(f"{num_slots} expert slots cannot hold {len(load)} experts")
    counts = [1] * len(load)
    for _ in range(num_slots - len(load)):
        best = max(range(len(load)), key=lambda e: (load[e] / counts[e], -e))
        counts[best] += 1
    return counts


def rebalance(load: Sequence[float], *, ep_size: int, slots_per_rank: int,
              previous: Sequence[int] | None = None) -> list[int]:
    """New `phys2log` (ep_size * slots_per_rank entries) for per-logical-expert `load`."""
    load = [float(x) for x in load]
    counts = replica_counts(load, ep_size * slots_per_rank)
    items = sorted(((load[e] / counts[e], e) for e in range(len(load)) for _ in range(counts[e])),
                   key=lambda item: (-item[0], item[1]))
    rank_load = [0.0] * ep_size
    held: list[list[int]] = [[] for _ in range(ep_size)]
    for weight, expert in items:
        free = [r for r in range(ep_size) if len(held[r]) < slots_per_rank]
        fresh = [r for r in free if expert not in held[r]] or free
        rank = min(fresh, key=lambda r: (rank_load[r], r))
        held[rank].append(expert)
        rank_load[rank] += weight
    return [e for r in range(ep_size) for e in _assign_slots(held[r], previous, r, slots_per_rank)]


def _assign_slots(experts: list[int], previous: Sequence[int] | None, rank: int, slots_per_rank: int) -> list[int]:
    slots: list[int | None] = [None] * slots_per_rank
    remaining = sorted(experts)
    if previous is not None:
        old = list(previous[rank * slots_per_rank:(rank + 1) * slots_per_rank])
        for s, e in enumerate(old):
            if e in remaining:
                slots[s] = e
                remaining.remove(e)
    it = iter(remaining)
    return [s if s is not None else next(it) for s in slots]
