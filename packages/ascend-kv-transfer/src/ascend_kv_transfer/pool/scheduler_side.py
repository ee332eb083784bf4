"""Scheduler half of the KV pool: prefix lookups against the store, load jobs on a hit, save jobs as blocks fill.

A lookup asks the master which of the request's next blocks exist for every rank and KV cache group
(`batch_is_exist` through the scheduler's own client, which lends no memory), and offers the longest leading run
for an asynchronous load. Each step, the full blocks a scheduled request will have computed by the step's end are
handed to the workers to save (they skip keys already present). A finished request whose saves may still be in
flight is held (`request_finished` returns True) until the workers report it finished sending.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from ascend_kv_transfer.pool.block_hashes import RequestHashes
from ascend_kv_transfer.pool.keys import PoolKeys
from ascend_kv_transfer.pool.store_client import StoreClient
from ascend_kv_transfer.ranks import RankCoords

logger = logging.getLogger(__name__)

_RECENT = 256


@dataclass
class PoolTransfer:
    """Blocks of one request to load or save: one id per block in each KV cache group, and the blocks' hashes."""

    req_id: str
    block_ids: list[list[int]]
    hashes: list[bytes]

    @property
    def num_blocks(self) -> int:
        return len(self.hashes)


@dataclass
class PoolStep:
    loads: list[PoolTransfer] = field(default_factory=list)
    saves: list[PoolTransfer] = field(default_factory=list)
    # Requests that finished with saves issued: report them finished sending once their saves are done.
    finished_saves: list[str] = field(default_factory=list)
    # Requests preempted this step: their blocks may be reused by this step's forward.
    preempted: list[str] = field(default_factory=list)
    # Nothing runs this step: a worker waiting on a load may block briefly instead of returning at once.
    idle: bool = False


@dataclass
class PoolSchedulerStats:
    lookups: int = 0
    lookup_blocks: int = 0
    hit_blocks: int = 0
    hit_tokens: int = 0
    save_jobs: int = 0
    save_blocks: int = 0
    held_requests: int = 0
    per_request_hits: OrderedDict[str, int] = field(default_factory=OrderedDict)


class PoolScheduler:
    def __init__(self, *, client: StoreClient, keys: PoolKeys, ranks: list[RankCoords], groups: list[int],
                 block_size: int, save: bool, save_output_blocks: bool):
        self.client = client
        self.keys = keys
        self.ranks = ranks
        self.groups = groups
        self.block_size = block_size
        self.save = save
        self.save_output_blocks = save_output_blocks
        self.hashes = RequestHashes(block_size)
        self.kv_cache_manager: Any = None
        self.stats = PoolSchedulerStats()
        self._step = PoolStep()
        self._pending_hits: dict[str, tuple[int, int]] = {}  # req -> (first block, blocks found)
        self._requests: dict[str, Any] = {}  # requests whose blocks are saved as they fill
        self._next_save: dict[str, int] = {}  # req -> blocks already handed to the workers
        self._has_saves: set[str] = set()
        self._held: set[str] = set()

    @property
    def keys_per_block(self) -> int:
        return len(self.ranks) * len(self.groups)

    # ---- lookups and loads --------------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int, bool]:
        self._pending_hits.pop(request.request_id, None)
        if not self.client.available or num_computed_tokens % self.block_size:
            return 0, False
        first = num_computed_tokens // self.block_size
        # Leave the last token to be computed: the step needs its logits.
        usable = (request.num_tokens - 1) // self.block_size
        if usable <= first:
            return 0, False
        hashes = self.hashes.get(request, usable)[first:]
        per = self.keys_per_block
        keys = [k for h in hashes for k in self.keys.block_keys(self.ranks, self.groups, h)]
        codes = self.client.exists(keys)
        hits = 0
        while hits < len(hashes) and all(c == 1 for c in codes[hits * per:(hits + 1) * per]):
            hits += 1
        self.stats.lookups += 1
        self.stats.lookup_blocks += len(hashes)
        if not hits:
            return 0, False
        self._pending_hits[request.request_id] = (first, hits)
        return hits * self.block_size, True

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        req_id = request.request_id
        if self.save and req_id not in self._requests:
            self._requests[req_id] = request
        pending = self._pending_hits.pop(req_id, None)
        if num_external_tokens <= 0 or pending is None:
            return
        first, count = pending
        count = min(count, num_external_tokens // self.block_size)
        if count <= 0:
            return
        group_ids = blocks.get_block_ids()
        self._step.loads.append(PoolTransfer(
            req_id, [list(group_ids[g][first:first + count]) for g in self.groups],
            self.hashes.get(request, first + count)[first:first + count]))
        self.stats.hit_blocks += count
        self.stats.hit_tokens += count * self.block_size
        self.stats.per_request_hits[req_id] = count * self.block_size
        while len(self.stats.per_request_hits) > _RECENT:
            self.stats.per_request_hits.popitem(last=False)

    # ---- saves --------------------------------------------------------------------------------------------------
    def _plan_saves(self, num_scheduled_tokens: dict[str, int]) -> None:
        for req_id, scheduled in num_scheduled_tokens.items():
            request = self._requests.get(req_id)
            if request is None:
                continue
            limit = request.num_tokens if self.save_output_blocks else request.num_prompt_tokens
            full = min(request.num_computed_tokens + scheduled, limit, request.num_tokens) // self.block_size
            start = self._next_save.get(req_id, 0)
            if full <= start:
                continue
            group_ids = self.kv_cache_manager.get_block_ids(req_id)
            if any(len(group_ids[g]) < full for g in self.groups):
                continue  # not allocated that far (never expected): save later
            hashes = self.hashes.get(request, full)
            self._step.saves.append(PoolTransfer(req_id, [list(group_ids[g][start:full]) for g in self.groups],
                                                 hashes[start:full]))
            self._next_save[req_id] = full
            self._has_saves.add(req_id)
            self.stats.save_jobs += 1
            self.stats.save_blocks += full - start

    def build_step(self, scheduler_output: Any) -> PoolStep:
        preempted = list(scheduler_output.preempted_req_ids or ())
        for req_id in preempted:
            # Its blocks are freed; the recompute after resumption is saved again (present keys are skipped).
            self._next_save.pop(req_id, None)
        self._step.preempted = preempted
        self._step.idle = not scheduler_output.total_num_scheduled_tokens
        if self.save and self.client.available:
            self._plan_saves(scheduler_output.num_scheduled_tokens)
        step, self._step = self._step, PoolStep()
        return step

    def request_finished(self, request: Any) -> tuple[bool, dict | None]:
        req_id = request.request_id
        self._pending_hits.pop(req_id, None)
        self._requests.pop(req_id, None)
        self._next_save.pop(req_id, None)
        self.hashes.drop(req_id)
        if req_id not in self._has_saves:
            return False, None
        self._has_saves.discard(req_id)
        self._step.finished_saves.append(req_id)
        self._held.add(req_id)
        self.stats.held_requests = len(self._held)
        return True, None

    def finished_sending(self, req_ids: set[str]) -> None:
        self._held -= req_ids
        self.stats.held_requests = len(self._held)
