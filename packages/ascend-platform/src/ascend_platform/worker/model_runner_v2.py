"""The Model Runner V2 of the Ascend platform: vLLM's MRV2 with our KV allocation.

MRV2 allocates inside `initialize_kv_cache` through a module-level `init_kv_cache` and has no hook for it, so our
runner swaps in `_ascend_init_kv_cache` for the duration of that call via the registered patch
`mrv2.init_kv_cache` (see `ascend_platform.patches.catalogue`). Nothing stays patched afterwards. Prefill context
parallel uses `ascend_platform.pcp.AscendPCPManager` through upstream's `pcp_manager_cls` hook; the attention
builders get that manager (its per-step attention layout). Graphs follow `GraphCapturePlan` through
`AscendGraphManager`, built in place of vLLM's graph manager (scoped patch `mrv2.cudagraph_manager`); the simulated
lane, whose CPU worker never captures, captures (eagerly, recording) once its KV cache exists. The sampler copies
its per-request tables to the device only on steps that added a request (`sampler_staging`).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from vllm.v1.worker.cpu.model_runner import CPUModelRunner as CPUModelRunnerV2
from vllm.v1.worker.gpu.attn_utils import get_shared_kv_cache_layers
from vllm.v1.worker.gpu.model_runner import GPUModelRunner as GPUModelRunnerV2
from vllm.v1.worker.utils import bind_kv_cache_to_layers

from ascend_platform import usage
from ascend_platform.patches import REGISTRY
from ascend_platform.worker import kv_binding, sampler_staging


class AscendRunnerV2Mixin:
    ascend_kv: Any = None

    @property
    def pcp_manager_cls(self) -> type:
        """Prefill context parallel runs on Ascend's manager (persistent buffers, never truncates real tokens)."""
        from ascend_platform.pcp import AscendPCPManager

        return AscendPCPManager

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        super().load_model(*args, **kwargs)
        if getattr(self, "sampler", None) is not None:  # the last PP rank of a generative model builds one
            sampler_staging.flush_only_after_add(self.sampler)

    def initialize_kv_cache(self, kv_cache_config: Any, is_profiling: bool = False,
                            kv_cache_allocation_context: AbstractContextManager | None = None) -> None:
        from ascend_platform.graph.manager import AscendGraphManager

        usage.note("runner", "v2")
        with REGISTRY.applied("mrv2.init_kv_cache", self._ascend_init_kv_cache), \
                REGISTRY.applied("mrv2.cudagraph_manager", AscendGraphManager):
            super().initialize_kv_cache(kv_cache_config, is_profiling=is_profiling,
                                        kv_cache_allocation_context=kv_cache_allocation_context)
        self._bind_pcp_manager()

    def _bind_pcp_manager(self) -> None:
        """Attention builders read the PCP manager's per-step layout (where each prefill chunk's keys are)."""
        if self.pcp_manager is None:
            return
        for groups in self.attn_groups:
            for group in groups:
                for builder in group.metadata_builders:
                    if hasattr(builder, "bind_pcp_manager"):
                        builder.bind_pcp_manager(self.pcp_manager)
        usage.note("pcp_manager", f"{type(self.pcp_manager).__module__}.{type(self.pcp_manager).__qualname__}")

    def _ascend_init_kv_cache(self, forward_context: dict[str, Any], kv_cache_config: Any, device: torch.device,
                              kernel_block_sizes: list[int], vllm_config: Any,
                              kv_cache_allocation_context: AbstractContextManager | None = None, *,
                              block_tables: Any = None, attn_groups: Any = ()) -> dict[str, torch.Tensor]:
        if vllm_config.attention_config.hisparse_config is not None:
            raise NotImplementedError("HiSparse KV caches are not supported by the Ascend runner")
        self.ascend_kv = kv_binding.allocate(kv_cache_config, vllm_config, device, kernel_block_sizes,
                                             kv_cache_allocation_context, forward_context)
        self._ascend_kernel_block_sizes = list(kernel_block_sizes)
        return self._bind(forward_context, kv_cache_config, vllm_config)

    def _bind(self, forward_context: dict[str, Any], kv_cache_config: Any, vllm_config: Any) -> dict[str, Any]:
        shared = get_shared_kv_cache_layers(vllm_config)
        kv_caches = kv_binding.vllm_views(self.ascend_kv, shared)
        bind_kv_cache_to_layers({n: c for n, c in kv_caches.items() if n in forward_context}, forward_context,
                                kv_binding.attention_modules_per_layer(vllm_config.model_config),
                                kv_cache_groups=kv_cache_config.kv_cache_groups)
        kv_binding.count_ascend_layers_on(self.ascend_kv, forward_context)
        return kv_caches

    def _init_kv_zero_meta(self) -> None:
        """vLLM's `KVBlockZeroer` reads planar layers' `[2, num_blocks, ...]` as blocks; ours zeroes through the
        allocation (`block_zeroing`)."""
        from ascend_platform.worker.block_zeroing import AscendBlockZeroer

        self.kv_block_zeroer = AscendBlockZeroer(self)

    def release_graphs(self) -> bool:
        """Sleep mode: drop the captured graphs (the graph manager's and the compiled pieces'). They recorded the
        addresses of the weights and KV cache sleep frees; wake-up gives those new memory, so the graphs are captured
        again then (`recapture_graphs`). Returns whether there were graphs."""
        from ascend_platform.graph.wrapper import release_static_graphs

        manager = self.cudagraph_manager
        if manager is None or not getattr(manager, "_graphs_captured", False):
            return False
        manager.release_graphs()
        usage.count("graphs.released", release_static_graphs() + len(manager.graphs))
        return True

    def recapture_graphs(self) -> None:
        """Capture every planned graph again, on the memory wake-up gave the weights and the KV cache."""
        self.capture_model()
        usage.count("graphs.recaptured")

    def release_kv_cache(self) -> None:
        kv_binding.connector_release_kv()
        kv_binding.detach_layer_kv(self.compilation_config.static_forward_context)
        self.kv_caches = []
        self.ascend_kv = None

    def reallocate_kv_cache(self) -> None:
        forward_context = self.compilation_config.static_forward_context
        self.ascend_kv = kv_binding.allocate(self.kv_cache_config, self.vllm_config, self.device,
                                             self._ascend_kernel_block_sizes, forward_context=forward_context)
        kv_caches = self._bind(forward_context, self.kv_cache_config, self.vllm_config)
        self.kv_caches = [c for c in kv_caches.values() if c.device == self.device]
        kv_binding.connector_register_kv(kv_caches)


class SimulatedModelRunnerV2(AscendRunnerV2Mixin, CPUModelRunnerV2):
    """MRV2 on the CPU device (simulated-NPU lane), on top of vLLM-CPU's MRV2 runner (its warm-up).

    With Triton in its interpreter, the block tables are `SimulatedBlockTables` (scoped patch `mrv2.block_tables`):
    their per-step gather and slot mapping run as torch / `ascend_kernels` instead of interpreted Triton.
    """

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        from ascend_platform.simulated import kernel_overrides

        super().load_model(*args, **kwargs)
        kernel_overrides.register_model_kernels()  # the model's module is imported now

    def initialize_kv_cache(self, kv_cache_config: Any, is_profiling: bool = False,
                            kv_cache_allocation_context: AbstractContextManager | None = None) -> None:
        from contextlib import ExitStack

        from ascend_platform.simulated import triton_interpreter

        with ExitStack() as scope:
            if triton_interpreter.enabled():
                from ascend_platform.simulated.mrv2_kernels.block_tables import SimulatedBlockTables

                scope.enter_context(REGISTRY.applied("mrv2.block_tables", SimulatedBlockTables))
            super().initialize_kv_cache(kv_cache_config, is_profiling=is_profiling,
                                        kv_cache_allocation_context=kv_cache_allocation_context)
        if not is_profiling:
            self.capture_graphs_eagerly()

    def recapture_graphs(self) -> None:
        self.capture_graphs_eagerly()
        usage.count("graphs.recaptured")

    def capture_graphs_eagerly(self) -> None:
        """The simulated lane's graph capture (vLLM's capture_model needs a CUDA-like device): every planned graph,
        through the graph manager, with the PCP manager's persistent buffers as inputs."""
        manager = self.cudagraph_manager
        if manager is None or not manager.needs_capture():
            return
        input_buffers = self.pcp_manager.input_buffers if self.pcp_manager is not None else self.input_buffers
        manager.capture(self.model, self.model_state, input_buffers, self.intermediate_tensors, self.block_tables,
                        self.attn_groups, self.kv_cache_config, pcp_manager=self.pcp_manager,
                        has_lora=self.lora_config is not None,
                        use_aux_hidden_state_outputs=self.use_aux_hidden_state_outputs)


class NPUModelRunnerV2(AscendRunnerV2Mixin, GPUModelRunnerV2):
    """MRV2 on an NPU."""
