"""Scheduler half of the offloading connector: prefix lookups in the host tier, loads on a hit, stores on finish.

Loads are synchronous (done before the step's forward); a finished request keeps its blocks until the worker has
copied its new full blocks to the host tier and reports it as finished sending.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ascend_kv_transfer.offload.lru import HostTierIndex


@dataclass
class OffloadStep:
    # (slots, device block ids) per request.
    loads: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)
    stores: dict[str, tuple[list[int], list[int]]] = field(default_factory=dict)


@dataclass
class OffloadSchedulerStats:
    lookups: int = 0
    hit_tokens: int = 0
    hit_blocks: int = 0
    stored_blocks: int = 0
    per_request_hits: dict[str, int] = field(default_factory=dict)


class OffloadScheduler:
    def __init__(self, *, index: HostTierIndex, block_size: int):
        self.index = index
        self.block_size = block_size
        self.stats = OffloadSchedulerStats()
        self._step = OffloadStep()
        self._pending_hits: dict[str, tuple[int, int]] = {}  # req -> (first block, number of blocks)

    def _hashes(self, request: Any) -> list[Any]:
        return list(request.block_hashes)

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        if num_computed_tokens % self.block_size:
            return 0, False
        first = num_computed_tokens // self.block_size
        # Leave the last prompt token to be computed: the step needs its logits.
        usable = min((request.num_prompt_tokens - 1) // self.block_size, len(self._hashes(request)))
        if usable <= first:
            return 0, False
        self.stats.lookups += 1
        hits = self.index.lookup_prefix(self._hashes(request)[first:usable])
        if hits:
            self._pending_hits[request.request_id] = (first, hits)
        else:
            self._pending_hits.pop(request.request_id, None)
        return hits * self.block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pending = self._pending_hits.pop(request.request_id, None)
        if num_external_tokens <= 0 or pending is None:
            return
        first, count = pending
        count = min(count, num_external_tokens // self.block_size)
        block_ids = blocks.get_block_ids()[0][first:first + count]
        slots = self.index.slots_for(self._hashes(request)[first:first + count])
        self.index.pin(slots)
        self._step.loads[request.request_id] = (slots, list(block_ids))
        self.stats.hit_tokens += count * self.block_size
        self.stats.hit_blocks += count
        self.stats.per_request_hits[request.request_id] = count * self.block_size
        while len(self.stats.per_request_hits) > 256:  # recent requests only
            self.stats.per_request_hits.pop(next(iter(self.stats.per_request_hits)))

    def request_finished(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict | None]:
        if getattr(request.status, "name", "") == "FINISHED_ABORTED" or not block_ids or not block_ids[0]:
            return False, None
        hashes = self._hashes(request)
        full = min(request.num_computed_tokens // self.block_size, len(hashes), len(block_ids[0]))
        slots, blocks = [], []
        for i in range(full):
            if hashes[i] in self.index:
                continue
            slot = self.index.allocate(hashes[i])
            if slot is None:  # every slot is pinned by a load this step: skip, it is only a cache
                break
            slots.append(slot)
            blocks.append(block_ids[0][i])
        if not slots:
            return False, None
        self._step.stores[request.request_id] = (slots, blocks)
        self.stats.stored_blocks += len(slots)
        return True, None

    def build_step(self) -> OffloadStep:
        step, self._step = self._step, OffloadStep()
        for slots, _blocks in step.loads.values():
            # The worker runs this step's loads before any later store can reuse the slots.
            self.index.unpin(slots)
        return step
