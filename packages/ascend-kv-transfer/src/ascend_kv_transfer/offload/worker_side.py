"""Worker half of the offloading connector: executes the scheduler's stores, then loads, before each forward."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_kv_transfer.offload.host_tier import HostTier
from ascend_kv_transfer.offload.scheduler_side import OffloadStep


@dataclass
class OffloadWorkerStats:
    blocks_stored: int = 0
    blocks_loaded: int = 0
    bytes_stored: int = 0
    bytes_loaded: int = 0


class OffloadWorker:
    def __init__(self, *, num_slots: int, num_blocks: int, layers: set[str]):
        self.num_slots = num_slots
        self.num_blocks = num_blocks
        self.layers = layers
        self.tier: HostTier | None = None
        self.stats = OffloadWorkerStats()
        self._finished_stores: set[str] = set()

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        ours = {name: t for name, t in kv_caches.items() if name in self.layers}
        self.tier = HostTier(ours, self.num_slots, self.num_blocks)

    def run_step(self, step: OffloadStep) -> None:
        assert self.tier is not None, "register_kv_caches() first"
        # Stores first: a load scheduled this step may read a slot a store of this step fills.
        for req_id, (slots, blocks) in step.stores.items():
            self.stats.bytes_stored += self.tier.store(slots, blocks)
            self.stats.blocks_stored += len(blocks)
            self._finished_stores.add(req_id)
        for slots, blocks in step.loads.values():
            self.stats.bytes_loaded += self.tier.load(slots, blocks)
            self.stats.blocks_loaded += len(blocks)

    def shutdown(self) -> None:
        if self.tier is not None:
            self.tier.close()

    def take_finished_stores(self) -> set[str]:
        done, self._finished_stores = self._finished_stores, set()
        return done
