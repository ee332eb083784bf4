"""Scheduler and worker halves of the layerwise connector, built on the P2P halves.

The prefill scheduler additionally tells its worker, every step, which block positions of each handed-off request
that step computes; the worker queues their writes layer by layer from `save_kv_layer` (sent by the decode peer's
writer thread once the layer's KV is written; the forward pass never waits). The decode worker runs a push hand-off
(`handoff.PushHandoff`) on the engine's own calls instead of pulling, so no request's wait holds another's.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from ascend_kv_transfer.p2p.handoff import Handoff, PushHandoff
from ascend_kv_transfer.p2p.layer_written import kv_written_on
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
    """The pushes of a step come from the step's metadata as the forward pass sees it: vLLM binds the metadata
    before the forward but calls `start_load_kv` after it when the step loads nothing synchronously, so per-step
    state set there would arrive one forward too late."""

    agent_cls = LayerwiseAgent

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._step: P2PStep | None = None
        self._pushed_layers: set[str] = set()
        self._device: torch.device | None = None
        self.layers_saved = 0
        self.layers_saved_late = 0

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        super().register_kv_caches(kv_caches)
        self._device = next((t.device for name, t in kv_caches.items() if name in self.layer_groups), None)

    def start_step(self, step: P2PStep) -> None:
        assert isinstance(self.agent, LayerwiseAgent)
        for transfer_id in step.dropped_transfers:
            self.agent.drop_push(transfer_id)
        super().start_step(step)
        for job in step.send.values():
            self.agent.finish(job.transfer_id, job.block_ids)

    def get_finished(self) -> tuple[set[str], set[str]]:
        assert isinstance(self.agent, LayerwiseAgent)
        finished = super().get_finished()
        if self.is_producer:
            self.agent.forget_expired_pushes()
        return finished

    def save_layer(self, layer: str, kv_layer: torch.Tensor | None, step: P2PStep) -> None:
        """From `save_kv_layer`, right after the layer's attention queued its cache write: queue its pushes."""
        if self._queue_layer(layer, kv_layer.device if kv_layer is not None else self._device, step):
            self.layers_saved += 1

    def end_step(self, step: P2PStep) -> None:
        """From `wait_for_save`: layers `save_kv_layer` was not called for (a backend outside the hook) go out now."""
        for layer in self.layer_groups:
            if self._queue_layer(layer, self._device, step):
                self.layers_saved_late += 1
        self._step = None

    def _queue_layer(self, layer: str, device: torch.device | None, step: P2PStep) -> bool:
        assert isinstance(self.agent, LayerwiseAgent)
        if step is not self._step:
            self._step, self._pushed_layers = step, set()
        pushes = getattr(step, "pushes", None)
        if layer not in self.layer_groups or layer in self._pushed_layers or not pushes:
            return False
        self._pushed_layers.add(layer)
        written = kv_written_on(device)
        for plan in pushes.values():
            self.agent.push_layer(plan.transfer_id, layer, plan.block_ids, plan.lo, plan.hi, written)
        return True

    def _handoff(self, req_id: str, job: RecvJob, address: tuple[str, int]) -> Handoff:
        # The prefill pushes whenever it computes the request: wait up to the prefill's own hold bound.
        wait_s = self.options.abort_timeout_s
        return PushHandoff(req_id=req_id, transfer_id=job.transfer_id, address=address,
                           local_block_ids=job.local_block_ids, first_block=job.first_block,
                           deadline=time.monotonic() + wait_s, wait_s=wait_s)

    def stats(self) -> dict[str, Any]:
        assert isinstance(self.agent, LayerwiseAgent)
        return super().stats() | {"layer_pushes": self.agent.layer_pushes, "bulk_pushes": self.agent.bulk_pushes,
                                  "layers_saved_in_forward": self.layers_saved,
                                  "layers_saved_after_forward": self.layers_saved_late,
                                  "push_writes_queued": self.agent.writes_queued(),
                                  "push_destinations": self.agent.known_destinations()}
