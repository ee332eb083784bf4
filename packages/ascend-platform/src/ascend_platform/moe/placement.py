"""Where one MoE layer's experts live under expert parallelism with redundant experts (EPLB).

There are `num_physical` expert slots, `slots_per_rank` on each of the `ep_size` expert-parallel ranks; physical
slot p sits on rank `p // slots_per_rank` as that rank's local weight row `p % slots_per_rank`. `phys2log[p]` is the
logical (checkpoint) expert slot p holds; an expert may hold several slots (replicas). Routing picks a replica per
token (token index modulo the replica count, so consecutive tokens alternate), counts the load of every physical
slot, and hands the fused-experts kernel the local row of each pair this rank holds (-1 for the others).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class ExpertPlacement:
    def __init__(self, phys2log: Sequence[int], *, num_logical: int, ep_size: int, ep_rank: int) -> None:
        phys2log = [int(e) for e in phys2log]
        if len(phys2log) % ep_size:
            raise ValueError(f"{len(phys2log)} physical expert slots do not split over {ep_size} EP ranks")
        missing = sorted(set(range(num_logical)) - set(phys2log))
        if missing or any(not 0 <= e < num_logical for e in phys2log):
            raise ValueError(f"placement must hold every logical expert 0..{num_logical - 1} once or more "
                             f"(missing {missing}, got {phys2log})")
        self.phys2log = phys2log
        self.num_logical = num_logical
        self.num_physical = len(phys2log)
        self.ep_size = ep_size
        self.ep_rank = ep_rank
        self.slots_per_rank = self.num_physical // ep_size
        replicas: list[list[int]] = [[] for _ in range(num_logical)]
        for p, e in enumerate(phys2log):
            replicas[e].append(p)
        width = max(len(r) for r in replicas)
        self.replica_count = torch.tensor([len(r) for r in replicas], dtype=torch.int64)
        self.log2phys = torch.tensor([r + [-1] * (width - len(r)) for r in replicas], dtype=torch.int64)

    @classmethod
    def initial(cls, *, num_logical: int, num_redundant: int, ep_size: int, ep_rank: int) -> ExpertPlacement:
        """vLLM's linear placement (rank r holds experts r*L .. r*L+L-1, L = num_logical / ep_size, as the
        checkpoint loader fills them), each rank's redundant slots copying its own experts round-robin (no data
        needs to move before the first rebalance)."""
        if num_logical % ep_size or num_redundant % ep_size:
            raise ValueError(f"{num_logical} experts and {num_redundant} redundant experts must both divide by the "
                             f"{ep_size} expert-parallel ranks")
        per_rank = num_logical // ep_size
        phys2log = []
        for r in range(ep_size):
            own = list(range(r * per_rank, (r + 1) * per_rank))
            phys2log += own + [own[i % per_rank] for i in range(num_redundant // ep_size)]
        return cls(phys2log, num_logical=num_logical, ep_size=ep_size, ep_rank=ep_rank)

    def local_slice(self, rank: int | None = None) -> list[int]:
        """Logical expert held by each local weight row of `rank` (default: this rank)."""
        r = self.ep_rank if rank is None else rank
        return self.phys2log[r * self.slots_per_rank:(r + 1) * self.slots_per_rank]

    def to(self, device: torch.device) -> ExpertPlacement:
        self.replica_count = self.replica_count.to(device)
        self.log2phys = self.log2phys.to(device)
        return self

    def physical_ids(self, logical_ids: torch.Tensor) -> torch.Tensor:
        """Physical slot of every (token, slot) pair: replica `token index % replica count` of its expert."""
        ids = logical_ids.long()
        token = torch.arange(ids.shape[0], device=ids.device).unsqueeze(1)
        replica = token % self.replica_count[ids]
        return self.log2phys[ids, replica]

    def local_rows(self, physical_ids: torch.Tensor) -> torch.Tensor:
        """This rank's weight row for each pair, -1 where another rank holds the slot."""
        first = self.ep_rank * self.slots_per_rank
        local = physical_ids - first
        return torch.where((local >= 0) & (local < self.slots_per_rank), local, torch.full_like(local, -1))

    def logical_load(self, physical_load: torch.Tensor) -> torch.Tensor:
        """Per logical expert, the tokens its replicas took."""
        out = torch.zeros(self.num_logical, dtype=physical_load.dtype, device=physical_load.device)
        return out.index_add_(0, torch.tensor(self.phys2log, device=physical_load.device), physical_load)

    def rank_load(self, physical_load: torch.Tensor) -> torch.Tensor:
        return physical_load.reshape(self.ep_size, self.slots_per_rank).sum(dim=1)


def imbalance(rank_load: torch.Tensor) -> float:
    """max / mean of the per-rank loads (1.0 = balanced; 1.0 for no load at all)."""
    load = rank_load.double()
    mean = float(load.mean())
    return float(load.max()) / mean if mean > 0 else 1.0
