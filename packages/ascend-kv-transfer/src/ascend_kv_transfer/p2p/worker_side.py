"""Worker half of the P2P connector: registers the KV memory, holds blocks (prefill), pulls them (decode).

Pulls advance on the engine's own calls (`p2p.step_pulls`); results are handed back through `get_finished`.
A failed pull still reports the request as finished receiving, and its blocks as load errors, so vLLM recomputes
the prompt instead of decoding from garbage.
"""

from __future__ import annotations

import logging
import queue
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ascend_kv_transfer.kv_regions import describe_kv_caches
from ascend_kv_transfer.options import MooncakeOptions
from ascend_kv_transfer.p2p.agent import MooncakeAgent, PullResult
from ascend_kv_transfer.p2p.ports import Ranks, worker_port
from ascend_kv_transfer.p2p.scheduler_side import P2PStep, RecvJob
from ascend_kv_transfer.p2p.schema import KVGeometry
from ascend_kv_transfer.p2p.step_pulls import StepDrivenPulls

logger = logging.getLogger(__name__)

_RECENT_PULLS = 256


class P2PWorker:
    agent_cls: type[MooncakeAgent] = MooncakeAgent

    def __init__(self, *, engine_id: str, role: str, options: MooncakeOptions, ranks: Ranks, geometry: KVGeometry,
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
        self._results: queue.Queue[tuple[str, RecvJob, PullResult]] = queue.Queue()
        self._pulls = StepDrivenPulls(self.agent, self._report, self._pool,
                                      inline_read_max_bytes=options.inline_read_max_bytes) \
            if self._pool is not None else None
        self._invalid_blocks: set[int] = set()
        self._failed_reqs: set[str] = set()
        # The most recent pulls per request, for stats and tests (bounded: engines run for weeks).
        self.pulled: OrderedDict[str, PullResult] = OrderedDict()

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        ours = {name: t for name, t in kv_caches.items() if name in self.layer_groups}
        missing = sorted(set(self.layer_groups) - set(ours))
        if missing:
            raise ValueError(f"register_kv_caches got no tensor for layers {missing[:4]} of the KV cache config")
        regions = describe_kv_caches(ours, self.num_blocks, self.layer_groups)
        self.agent.register(regions)
        if self.is_producer:
            self.agent.serve(worker_port(self.options.side_channel_port, self.ranks))
        logger.info("registered %d KV layers in %d storage(s) with Mooncake at %s", len(regions.regions),
                    len(regions.storages), self.agent.engine.segment)

    def start_step(self, step: P2PStep) -> None:
        for transfer_id in step.dropped_transfers:
            self.agent.drop(transfer_id)
        for req_id, job in step.send.items():
            self.agent.hold(job.transfer_id, req_id, job.block_ids)
        if self.is_producer:
            self.agent.serve_pending()  # claims that arrived before this hold get it now
        for req_id, job in step.recv.items():
            assert self.is_consumer, "recv job on a worker that is not a KV consumer"
            self._receive(req_id, job, (job.address[0], job.address[1] + self.ranks.worker_offset))
        if self._pulls is not None:
            self._pulls.advance()

    def _receive(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> None:
        assert self._pulls is not None
        self._pulls.add(req_id, job, address)

    def _report(self, req_id: str, job: RecvJob, result: PullResult) -> None:
        self._results.put((req_id, job, result))

    def get_finished(self) -> tuple[set[str], set[str]]:
        if self._pulls is not None:
            self._pulls.advance()
        if self.is_producer:
            self.agent.serve_pending()
        recving: set[str] = set()
        while True:
            try:
                req_id, job, result = self._results.get_nowait()
            except queue.Empty:
                break
            recving.add(req_id)
            self.pulled[req_id] = result
            while len(self.pulled) > _RECENT_PULLS:
                self.pulled.popitem(last=False)
            if not result.ok:
                if self.num_groups > 1:  # block ids repeat across groups: report the request instead
                    self._failed_reqs.add(req_id)
                else:
                    self._invalid_blocks.update(b for ids in job.local_block_ids for b in ids)
        sending = self.agent.take_finished_sends() if self.is_producer else set()
        return sending, recving

    def take_failed_reqs(self) -> set[str]:
        failed, self._failed_reqs = self._failed_reqs, set()
        return failed

    def take_invalid_blocks(self) -> set[int]:
        invalid, self._invalid_blocks = self._invalid_blocks, set()
        return invalid

    def stats(self) -> dict[str, Any]:
        out = self.agent.stats.as_dict() | {"held_now": self.agent.num_held()}
        if self._pulls is not None:
            out |= {"inline_reads": self._pulls.inline_reads, "background_reads": self._pulls.background_reads}
        return out

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._pulls is not None:
            self._pulls.close()
        self.agent.close()
