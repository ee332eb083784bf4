"""MRV2's graph manager on Ascend: which graphs exist and which one a step runs come from `GraphCapturePlan`.

vLLM's `ModelCudaGraphManager` keeps its own candidate tables and captures with CUDA's graph API. The Ascend runner
builds this subclass instead (scoped patch `mrv2.cudagraph_manager`), which
* captures exactly `plan.capture_descriptors()` (FULL graphs only for uniform decodes, PIECEWISE graphs for mixed
  batches, one per capture size) through a `GraphBackend`: ACL graphs on a device, eager "graphs" in the simulated
  lane (`ascend_platform.graph.backends`);
* dispatches each step by `plan.descriptor_for` (eager past the largest capture size), under PCP with the
  rank-local token count the runner hands it and the batch's uniformity from the global batch;
* where no torch.compile'd piece exists (the simulated lane) wraps the whole model in the platform's static-graph
  wrapper for PIECEWISE steps, so their capture and replay go through the same wrapper vLLM's compiled pieces use.
  On a device that would put attention, whose lengths the kernels take on the host, inside one graph: PIECEWISE
  graphs there come only from the compiled model's pieces (vLLM refuses the capture otherwise);
* captures FULL graphs into the platform's global graph pool (`self.pool`, as vLLM's manager), honouring vLLM's
  memory-profiling hooks (`_max_full_descs_to_capture`, `_capture_mem_samples`).
Every decision is recorded (`ascend_platform.graph.trace`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.utils.import_utils import resolve_obj_by_qualname
from vllm.v1.worker.gpu.cudagraph_utils import (
    BatchExecutionDescriptor,
    CudaGraphManager,
    ModelCudaGraphManager,
    has_compiled_submodule,
)

from ascend_platform.graph import trace
from ascend_platform.graph.backends import GraphBackend, default_backend
from ascend_platform.graph.plan import GraphCapturePlan
from ascend_platform.registration import simulate_requested

logger = init_logger(__name__)


class _PlannedCapture(CudaGraphManager):
    """Sits between vLLM's ModelCudaGraphManager and CudaGraphManager in the MRO: the former's `capture` ends with
    `super().capture(create_forward_fn, ...)`, which lands here instead of CUDA's capture loop."""

    def capture(self, create_forward_fn: Any, progress_bar_desc: str = "") -> None:  # type: ignore[override]
        self.capture_graphs(create_forward_fn)


class AscendGraphManager(ModelCudaGraphManager, _PlannedCapture):
    def __init__(self, vllm_config: Any, device: Any, cudagraph_mode: CUDAGraphMode, decode_query_len: int,
                 lora_capture_cases: list[int] | None = None, varlen_decode: bool = False,
                 ubatch_runner: Any = None) -> None:
        super().__init__(vllm_config, device, cudagraph_mode, decode_query_len,
                         lora_capture_cases=lora_capture_cases, varlen_decode=varlen_decode,
                         ubatch_runner=ubatch_runner)
        self.plan = GraphCapturePlan.from_compilation_config(self.compilation_config, self.max_num_reqs,
                                                             decode_query_len, mode=cudagraph_mode)
        if self.plan.capture_sizes:
            unsupported = [what for what, on in (("LoRA capture cases", self.lora_capture_cases != [0]),
                                                 ("microbatching", ubatch_runner is not None),
                                                 ("variable-length decode graphs", varlen_decode)) if on]
            if unsupported:
                raise NotImplementedError(
                    f"Ascend graph capture ({cudagraph_mode.name}) does not plan graphs for {', '.join(unsupported)}; "
                    "set additional_config graph_mode='eager'")
        self._capture_descs = self.plan.descriptors_by_mode()
        self._full = [d for d in self.plan.capture_descriptors() if d.cg_mode == CUDAGraphMode.FULL]
        self.backend: GraphBackend | None = None
        logger.info("Ascend graph plan: %s, sizes %s, %d graphs", cudagraph_mode.name, list(self.plan.capture_sizes),
                    sum(len(d) for d in self._capture_descs.values()))

    # ---- dispatch --------------------------------------------------------------------------------------------------
    def dispatch(self, num_reqs: int, num_tokens: int, uniform_token_count: int | None, num_active_loras: int,
                 max_query_len: int | None = None, num_ubatches: int = 1) -> BatchExecutionDescriptor:
        decode_only = uniform_token_count is not None and uniform_token_count == self.decode_query_len
        if not self._graphs_captured or num_tokens == 0 or num_active_loras or num_ubatches != 1:
            return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_tokens, num_reqs=num_reqs,
                                            num_active_loras=num_active_loras, num_ubatches=num_ubatches)
        desc = self.plan.descriptor_for(num_reqs, num_tokens, decode_only=decode_only, uniform=decode_only)
        trace.dispatched(self.plan.batch_kind(decode_only=decode_only), desc.cg_mode,
                         num_tokens > self.plan.max_capture_size)
        return desc

    # ---- capture ---------------------------------------------------------------------------------------------------
    def capture(self, model: nn.Module, *args: Any, **kwargs: Any) -> None:
        """vLLM's `ModelCudaGraphManager.capture` (it stages each descriptor's inputs and builds the forward); with no
        compiled piece the whole model is one PIECEWISE piece in the platform's static-graph wrapper."""
        if self.cudagraph_mode.has_piecewise_cudagraphs() and not has_compiled_submodule(model) and \
                simulate_requested():
            self.use_breakable_cg = True  # vLLM's name for "piecewise graphs without torch.compile"
        super().capture(model, *args, **kwargs)

    def init_breakable_cg_runner(self, model: nn.Module) -> None:
        if self.breakable_cg_runner is None:
            from vllm.platforms import current_platform

            wrapper_cls = resolve_obj_by_qualname(current_platform.get_static_graph_wrapper_cls())
            self.breakable_cg_runner = wrapper_cls(runnable=model, vllm_config=self.vllm_config,
                                                   runtime_mode=CUDAGraphMode.PIECEWISE)

    def release_graphs(self) -> None:
        self.graphs.clear()
        self._graphs_captured = False
        self.breakable_cg_runner = None

    def _graph_backend(self) -> GraphBackend:
        if self.backend is None:
            self.backend = default_backend(simulated=simulate_requested(), pool=self.pool)
        return self.backend

    def capture_graphs(self, create_forward_fn: Callable[..., Callable[[CUDAGraphMode], None]]) -> None:
        """Capture every planned descriptor: PIECEWISE first (larger activations), then FULL, largest first."""
        backend = self._graph_backend()
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            descs = self._capture_descs.get(mode, [])
            if mode == CUDAGraphMode.FULL and self._max_full_descs_to_capture is not None:
                descs = descs[:self._max_full_descs_to_capture]  # vLLM's memory profiling samples the largest
            for desc in descs:
                forward_fn = create_forward_fn(desc, warmup=True)
                forward_fn(CUDAGraphMode.NONE)  # warm-up, outside any graph
                if mode == CUDAGraphMode.PIECEWISE:
                    forward_fn(CUDAGraphMode.PIECEWISE)  # the wrapper captures it under the step's descriptor
                    continue
                forward_fn = create_forward_fn(desc, warmup=False)  # fresh attention state for the capture
                free_before = self._free_memory() if self._capture_mem_samples is not None else 0
                self.graphs[desc] = backend.capture(lambda fn=forward_fn: fn(CUDAGraphMode.NONE))
                if self._capture_mem_samples is not None:
                    self._capture_mem_samples.append(free_before - self._free_memory())
                trace.captured(mode, desc.num_tokens)
        self._graphs_captured = True
        logger.info("captured %d FULL graphs and %d PIECEWISE sizes (%s backend)", len(self.graphs),
                    len(self._capture_descs.get(CUDAGraphMode.PIECEWISE, [])), backend.name)

    @staticmethod
    def _free_memory() -> int:
        torch.accelerator.synchronize()
        return torch.accelerator.get_memory_info()[0]

    def run_fullgraph(self, desc: BatchExecutionDescriptor) -> Any:
        trace.replayed(desc.cg_mode, desc.num_tokens)
        return super().run_fullgraph(desc)
