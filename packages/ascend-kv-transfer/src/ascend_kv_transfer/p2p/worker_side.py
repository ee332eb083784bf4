"""Worker half of the P2P connector: registers the KV memory, holds blocks (prefill), pulls them (decode).

Hand-offs advance on the engine's own calls (`p2p.step_driver`), all on the engine's thread: the ones that ended
in a call are kept in a plain list until `get_finished` hands them to vLLM.
A decode worker reads each transfer from the prefill rank `p2p.rank_groups` names (its own TP rank unless the KV is
replicated over TP, MLA, and the TP sizes differ) and tells the prefill ranks nobody reads to free their blocks.
A failed pull still reports the request as finished receiving, and its blocks as load errors, so vLLM recomputes
the prompt instead of decoding from garbage. `register_kv_caches` called again means the KV memory moved (the
Ascend platform re-allocates it on wake-up): the registration follows it and hand-offs into the old memory fail.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ascend_kv_transfer.kv_regions import KVRegions, connector_layers, describe_kv_caches
from ascend_kv_transfer.load_failures import LoadFailures
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.agent import MooncakeAgent
from ascend_kv_transfer.p2p.handoff import Handoff, PullHandoff, PullResult
from ascend_kv_transfer.p2p.ports import peer_offset, worker_port
from ascend_kv_transfer.p2p.rank_groups import ReadPlan, plan_reads
from ascend_kv_transfer.p2p.scheduler_side import P2PStep, RecvJob
from ascend_kv_transfer.p2p.schema import KVGeometry
from ascend_kv_transfer.p2p.step_driver import StepDriver
from ascend_kv_transfer.ranks import RankCoords

logger = logging.getLogger(__name__)

_RECENT_PULLS = 256


class P2PWorker:
    agent_cls: type[MooncakeAgent] = MooncakeAgent

    def __init__(self, *, engine_id: str, role: str, options: MooncakeOptions, ranks: RankCoords, geometry: KVGeometry,
                 num_blocks: int, layer_groups: dict[str, int]):
        self.is_producer = role in ("kv_producer", "kv_both")
        self.is_consumer = role in ("kv_consumer", "kv_both")
        self.options = options
        self.ranks = ranks
        self.num_blocks = num_blocks
        self.layer_groups = layer_groups
        self.num_groups = max(layer_groups.values(), default=0) + 1
        self.agent = self.agent_cls(engine_id=engine_id, geometry=geometry, options=options, tp_rank=ranks.tp_rank,
                                   pp_rank=ranks.pp_rank, pcp_rank=ranks.pcp_rank)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ascend-kv-pull") if self.is_consumer \
            else None
        # Pulls that ended since the last `get_finished`, as (request, its blocks, result); the engine's thread only.
        self._ended: list[tuple[str, list[list[int]], PullResult]] = []
        self._driver = StepDriver(self.agent, self._pool, inline_read_max_bytes=options.inline_read_max_bytes) \
            if self._pool is not None else None
        self.registrations = 0
        self._regions: KVRegions | None = None
        self.load_failures = LoadFailures(self.num_groups)
        # The most recent pulls per request, for stats and tests (bounded: engines run for weeks).
        self.pulled: OrderedDict[str, PullResult] = OrderedDict()

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        """At start-up, and again whenever the KV memory was re-allocated (the Ascend platform's wake-up)."""
        ours = connector_layers(kv_caches, self.layer_groups)
        regions = describe_kv_caches(ours, self.num_blocks, self.layer_groups)
        self._abandon_handoffs("the KV memory it was loading into was re-allocated")
        self.agent.register(regions)
        self._regions = regions
        if self.is_producer and not self.registrations:
            self.agent.serve(worker_port(self.options.side_channel_port, self.ranks))
        self.registrations += 1
        logger.info("registered %d KV layers in %d span(s) with Mooncake at %s (registration %d)",
                    len(regions.regions), len(regions.storages), self.agent.engine.segment, self.registrations)

    def unregister_kv_caches(self) -> None:
        """Before the KV memory is freed (sleep): nothing may transfer into or out of it any more."""
        self._abandon_handoffs("the KV memory it was loading into was released")
        self.agent.unregister()

    def restore_kv_caches(self) -> None:
        """After a wake-up that kept the KV memory's addresses (vLLM's own sleep mode): register it again."""
        if self.agent.kv is None and self._regions is not None:
            self.agent.register(self._regions)

    def _abandon_handoffs(self, reason: str) -> None:
        if self._driver is not None and self._driver.waiting():
            self._keep(self._driver.abandon_all(reason))

    def start_step(self, step: P2PStep) -> None:
        for transfer_id in step.dropped_transfers:
            self.agent.holds.drop(transfer_id)
        for req_id, job in step.send.items():
            self.agent.holds.hold(job.transfer_id, req_id, job.block_ids)
        if self.is_producer:
            self.agent.serve_pending()  # claims that arrived before this hold get it now
        for req_id, job in step.recv.items():
            assert self.is_consumer, "recv job on a worker that is not a KV consumer"
            self._receive(req_id, job)
        if self._driver is not None:
            self._keep(self._driver.advance())

    def read_plan(self, job: RecvJob) -> ReadPlan:
        prefill_tp = job.remote_tp_size or self.ranks.tp_size
        return plan_reads(self.ranks.tp_rank, self.ranks.tp_size, prefill_tp, transfer_id=job.transfer_id,
                          replicated=self.agent.geometry.tp_replicated and self.agent.reads_one_replica)

    def _receive(self, req_id: str, job: RecvJob) -> None:
        assert self._driver is not None
        prefill_tp = job.remote_tp_size or self.ranks.tp_size
        try:
            plan = self.read_plan(job)
        except ValueError as e:  # TP sizes that do not divide: fail this request (vLLM recomputes), not the engine
            logger.error("request %s: cannot pull transfer %s: %s", req_id, job.transfer_id, e)
            if not any(job.local_block_ids):  # an abort's release: nothing to report (the prefill times it out)
                return
            result = PullResult(job.transfer_id, ok=False, error=f"{type(e).__name__}: {e}")
            self.agent.stats.record(result)
            self._ended.append((req_id, job.local_block_ids, result))
            return
        host, port = job.address
        for rank in plan.release:
            self._driver.release_unread((host, port + peer_offset(self.ranks, prefill_tp, rank)), job.transfer_id)
        handoff = self._handoff(req_id, job, (host, port + peer_offset(self.ranks, prefill_tp, plan.source)))
        handoff.readers = plan.readers
        self._driver.add(handoff)

    def _handoff(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> Handoff:
        wait_s = self.options.claim_wait_s
        return PullHandoff(req_id=req_id, transfer_id=job.transfer_id, address=address,
                           local_block_ids=job.local_block_ids, first_block=job.first_block,
                           deadline=time.monotonic() + wait_s, wait_s=wait_s)

    def _keep(self, ended: list[tuple[Handoff, PullResult]]) -> None:
        self._ended += [(handoff.req_id, handoff.local_block_ids, result) for handoff, result in ended]

    def get_finished(self) -> tuple[set[str], set[str]]:
        if self._driver is not None:
            self._keep(self._driver.advance())
        if self.is_producer:
            self.agent.serve_pending()
        recving: set[str] = set()
        ended, self._ended = self._ended, []
        for req_id, local_block_ids, result in ended:
            recving.add(req_id)
            self.pulled[req_id] = result
            while len(self.pulled) > _RECENT_PULLS:
                self.pulled.popitem(last=False)
            if not result.ok:
                self.load_failures.record(req_id, (b for ids in local_block_ids for b in ids))
        sending = self.agent.holds.take_finished_sends() if self.is_producer else set()
        return sending, recving

    def stats(self) -> dict[str, Any]:
        out = self.agent.stats.as_dict() | {
            "held_now": self.agent.holds.num_held(), "side_channel_refused": self.agent.refused(),
            "registrations": self.registrations, "epoch": self.agent.epoch,
            # What Mooncake has registered now, as [address, bytes] (the KV memory the transfers may touch).
            "registered": [[s.addr, s.nbytes] for s in self.agent.engine.registered]}
        if self._driver is not None:
            out |= {"inline_reads": self._driver.inline_reads, "background_reads": self._driver.background_reads,
                    "inline_overruns": self._driver.inline_overruns, "handoffs_waiting": self._driver.waiting()}
        return out

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._driver is not None:
            self._driver.close()
        self.agent.close()
