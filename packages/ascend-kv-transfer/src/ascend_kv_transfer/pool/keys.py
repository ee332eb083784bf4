"""Store keys of the KV pool: one object per block per rank per KV cache group.

`<namespace>/<rank>/g<group>/<block hash>`, where the namespace names the model and digests what must agree for the
bytes of a block to mean the same thing (KV geometry, block size, parallel sizes, number of KV cache groups), and
the rank part gives this worker's tp/pp/pcp/dcp coordinates. Engines with the same model and layout therefore share
objects rank by rank; anything else lands in a different namespace instead of loading garbage.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

from ascend_kv_transfer.ranks import RankCoords

KEY_VERSION = "akv1"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


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
