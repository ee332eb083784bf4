"""Scheduler and worker halves of the layerwise connector, built on the P2P halves.

The prefill scheduler additionally tells its worker, every step, which block positions of each handed-off request
that step computes; the worker pushes them layer by layer from `save_kv_layer`. The decode worker waits for the
push instead of pulling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_kv_transfer.p2p.layerwise_agent import LayerwiseAgent
from ascend_kv_transfer.p2p.scheduler_side import P2PScheduler, P2PStep, RecvJob
from ascend_kv_transfer.p2p.worker_side import P2PWorker


@dataclass
class PushPlan:
    transfer_id: str
    block_ids: list[list[int]]
    lo: int
    hi: int


@dataclass
class LayerwiseStep(P2PStep):
    pushes: dict[str, PushPlan] | None = None


class LayerwiseScheduler(P2PScheduler):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._producing: dict[str, Any] = {}
        self.kv_cache_manager: Any = None

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        params = request.kv_transfer_params or {}
        if params.get("do_remote_decode") and self.is_producer:
            params.setdefault("transfer_id", f"xfer-{request.request_id}")
            self._producing[request.request_id] = request
        super().update_state_after_alloc(request, blocks, num_external_tokens)

    def request_finished(self, request: Any, block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        self._producing.pop(request.request_id, None)
        return super().request_finished(request, block_ids)

    def build_layerwise_step(self, num_scheduled_tokens: dict[str, int]) -> LayerwiseStep:
        base = self.build_step()
        pushes = {}
        for req_id, request in self._producing.items():
            n = num_scheduled_tokens.get(req_id, 0)
            start = request.num_computed_tokens  # not yet advanced for this step
            end = min(start + n, request.num_prompt_tokens)
            if n <= 0 or start >= end or self.kv_cache_manager is None:
                continue
            ids = [list(g) for g in self.kv_cache_manager.get_block_ids(req_id)]
            pushes[req_id] = PushPlan(str(request.kv_transfer_params["transfer_id"]), ids,
                                      start // self.block_size, (end - 1) // self.block_size)
        return LayerwiseStep(recv=base.recv, send=base.send, dropped_transfers=base.dropped_transfers, pushes=pushes)


class LayerwiseWorker(P2PWorker):
    agent_cls = LayerwiseAgent

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._pushes: dict[str, PushPlan] = {}
        self._pushed_layers: set[str] = set()

    def start_step(self, step: P2PStep) -> None:
        assert isinstance(self.agent, LayerwiseAgent)
        self._pushes = dict(getattr(step, "pushes", None) or {})
        self._pushed_layers = set()
        super().start_step(step)
        for req_id, job in step.send.items():
            del req_id
            self.agent.finish(job.transfer_id, job.block_ids)

    def save_layer(self, layer: str) -> None:
        assert isinstance(self.agent, LayerwiseAgent)
        if layer not in self.layer_groups:
            return
        self._pushed_layers.add(layer)
        for plan in self._pushes.values():
            self.agent.push_layer(plan.transfer_id, layer, plan.block_ids, plan.lo, plan.hi)

    def end_step(self) -> None:
        """Layers `save_kv_layer` was not called for this step (e.g. a backend outside the hook) go out now."""
        for layer in self.layer_groups:
            if layer not in self._pushed_layers and self._pushes:
                self.save_layer(layer)
        self._pushes = {}

    def _receive(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> None:
        # The push arrives whenever the prefill computes each layer: the wait belongs on a thread.
        assert self._pool is not None
        self._pool.submit(self._await_push, req_id, job, address)

    def _await_push(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> None:
        assert isinstance(self.agent, LayerwiseAgent)
        if not any(job.local_block_ids):
            self.agent.release(address, job.transfer_id)
            return
        result = self.agent.await_push(address, job.transfer_id, job.local_block_ids, job.first_block)
        self._results.put((req_id, job, result))

    def stats(self) -> dict[str, Any]:
        assert isinstance(self.agent, LayerwiseAgent)
        return super().stats() | {"layer_pushes": self.agent.layer_pushes, "bulk_pushes": self.agent.bulk_pushes,
                                  "push_destinations": self.agent.known_destinations()}
