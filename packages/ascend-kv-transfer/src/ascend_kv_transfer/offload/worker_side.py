"""Worker half of the offloading connector: executes the scheduler's stores, then loads, before each forward.

The tier follows the KV memory through sleep and wake: released before the memory is freed, bound to the new
tensors when they are registered again (or to the same ones when a wake-up kept them), its host slots intact.
"""

from __future__ import annotations

import weakref
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
        # The last registered tensors, not kept alive: a wake-up that kept them finds them here.
        self._registered: dict[str, weakref.ref] = {}
        self.registrations = 0

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        ours = {name: t for name, t in kv_caches.items() if name in self.layers}
        if self.tier is None:
            self.tier = HostTier(ours, self.num_slots, self.num_blocks)
        else:
            self.tier.bind(ours)
        self._registered = {name: weakref.ref(t) for name, t in ours.items()}
        self.registrations += 1

    def unregister_kv_caches(self) -> None:
        if self.tier is not None:
            self.tier.unbind()

    def restore_kv_caches(self) -> None:
        tensors = {name: ref() for name, ref in self._registered.items()}
        if self.tier is not None and not self.tier.bound and all(t is not None for t in tensors.values()):
            self.tier.bind(tensors)

    def registered(self) -> list[list[int]]:
        """The KV memory the tier copies from and to now, as [address, bytes] spans."""
        if self.tier is None or not self.tier.bound:
            return []
        return [[s.addr, s.nbytes] for s in self.tier.regions.storages]

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
