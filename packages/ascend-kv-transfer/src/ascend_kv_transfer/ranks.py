"""A worker's place in its engine and deployment: data, tensor, pipeline and context parallel ranks and sizes.

One type for both connector families: the P2P side channel lays its ports out by it (`p2p.ports`: dp, then pp x pcp,
then tp; decode context parallelism shares the TP ranks, so it adds no workers), and the KV pool names a block's
objects by it (`pool.keys`: tp/pp/pcp/dcp coordinates, no dp: every DP engine of a model shares the pool). vLLM's
config and process groups are read into it once, by `vllm_config_info.engine_ranks` / `worker_ranks`.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class RankCoords:
    dp_rank: int = 0
    tp_rank: int = 0
    tp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    pcp_rank: int = 0
    pcp_size: int = 1
    dcp_rank: int = 0
    dcp_size: int = 1

    def __post_init__(self) -> None:
        for axis in ("tp", "pp", "pcp", "dcp"):
            rank, size = getattr(self, f"{axis}_rank"), getattr(self, f"{axis}_size")
            if size < 1 or not 0 <= rank < size:
                raise ValueError(f"{axis}_rank={rank} outside {axis}_size={size}")
        if self.dp_rank < 0:
            raise ValueError(f"dp_rank={self.dp_rank}")

    # ---- the side channel's port layout ------------------------------------------------------------------------
    @property
    def engine_offset(self) -> int:
        return self.dp_rank * self.tp_size * self.pp_size * self.pcp_size

    @property
    def worker_offset(self) -> int:
        return (self.pp_rank * self.pcp_size + self.pcp_rank) * self.tp_size + self.tp_rank

    # ---- the pool's object names -------------------------------------------------------------------------------
    @property
    def tag(self) -> str:
        return (f"tp{self.tp_rank}-{self.tp_size}.pp{self.pp_rank}-{self.pp_size}."
                f"pcp{self.pcp_rank}-{self.pcp_size}.dcp{self.dcp_rank}-{self.dcp_size}")

    def all_ranks(self) -> list[RankCoords]:
        """Every rank of an engine with these sizes (what a pooled block needs to be whole)."""
        return [RankCoords(tp_rank=tp, tp_size=self.tp_size, pp_rank=pp, pp_size=self.pp_size, pcp_rank=pcp,
                           pcp_size=self.pcp_size, dcp_rank=dcp, dcp_size=self.dcp_size)
                for pp, pcp, dcp, tp in itertools.product(range(self.pp_size), range(self.pcp_size),
                                                          range(self.dcp_size), range(self.tp_size))]

    def tp_collapsed(self) -> RankCoords:
        """These coordinates with the TP ranks counted as one (KV that every TP rank holds whole, e.g. MLA's)."""
        return dataclasses.replace(self, tp_rank=0, tp_size=1)
