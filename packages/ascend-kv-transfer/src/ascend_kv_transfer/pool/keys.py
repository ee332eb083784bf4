"""Store keys of the KV pool: one object per block per rank per KV cache group.

`<namespace>/<rank>/g<group>/<block hash>`, where the namespace names the model and digests what must agree for the
bytes of a block to mean the same thing (KV geometry, block size, parallel sizes, number of KV cache groups), and
the rank part gives this worker's tp/pp/pcp/dcp coordinates. Engines with the same model and layout therefore share
objects rank by rank; anything else lands in a different namespace instead of loading garbage.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

KEY_VERSION = "akv1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


@dataclass(frozen=True, kw_only=True)
class RankCoords:
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

    @property
    def tag(self) -> str:
        return (f"tp{self.tp_rank}-{self.tp_size}.pp{self.pp_rank}-{self.pp_size}."
                f"pcp{self.pcp_rank}-{self.pcp_size}.dcp{self.dcp_rank}-{self.dcp_size}")

    def all_ranks(self) -> list[RankCoords]:
        """Every rank of an engine with these sizes (what a block needs to be whole)."""
        return [RankCoords(tp_rank=tp, tp_size=self.tp_size, pp_rank=pp, pp_size=self.pp_size, pcp_rank=pcp,
                           pcp_size=self.pcp_size, dcp_rank=dcp, dcp_size=self.dcp_size)
                for pp, pcp, dcp, tp in itertools.product(range(self.pp_size), range(self.pcp_size),
                                                          range(self.dcp_size), range(self.tp_size))]


def pool_namespace(model: str, layout: Sequence[object]) -> str:
    """`model` kept readable (its last path parts, sanitised) plus a digest of the full name and the layout."""
    readable = _UNSAFE.sub("_", "/".join(model.rstrip("/").split("/")[-2:]))[-48:] or "model"
    digest = hashlib.sha256(repr((model, tuple(layout))).encode()).hexdigest()[:12]
    return f"{KEY_VERSION}/{readable}/{digest}"


@dataclass(frozen=True)
class PoolKeys:
    namespace: str

    def key(self, rank: RankCoords, group: int, block_hash: bytes) -> str:
        return f"{self.namespace}/{rank.tag}/g{group}/{block_hash[:16].hex()}"

    def block_keys(self, ranks: Sequence[RankCoords], groups: Sequence[int], block_hash: bytes) -> list[str]:
        return [self.key(rank, group, block_hash) for rank in ranks for group in groups]
