"""The V1 model runner of the Ascend platform: vLLM's runner with our KV allocation.

`AscendRunnerV1Mixin` only replaces `initialize_kv_cache_tensors` (allocate with our allocator, bind its tensors to
vLLM's layers, which hand them to the attention impls) and adds `release_kv_cache`/`reallocate_kv_cache` and
`release_graphs`/`recapture_graphs` for sleep mode. The simulated lane puts it on vLLM's CPU runner (its host/device
buffer handling is exactly what a CPU device needs); a device uses vLLM's GPU runner.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.utils import bind_kv_cache

from ascend_core.upstream import bind_kv_cache_kwargs
from ascend_platform import usage
from ascend_platform.worker import kv_binding
from ascend_platform.worker.block_zeroing import AscendBlockZeroer


class AscendRunnerV1Mixin:
    ascend_kv: Any = None

    def initialize_kv_cache_tensors(self, kv_cache_config: Any, kernel_block_sizes: list[int],
                                    kv_cache_allocation_context: AbstractContextManager | None = None,
                                    ) -> dict[str, torch.Tensor]:
        usage.note("runner", "v1")
        forward_context = self.compilation_config.static_forward_context
        self.ascend_kv = kv_binding.allocate(kv_cache_config, self.vllm_config, self.device, kernel_block_sizes,
                                             kv_cache_allocation_context, forward_context)
        shared = dict(self.shared_kv_cache_layers)
        kv_caches = kv_binding.vllm_views(self.ascend_kv, shared)
        bind_kv_cache(kv_caches, forward_context, self.kv_caches,
                      kv_binding.attention_modules_per_layer(self.model_config),
                      **bind_kv_cache_kwargs(kv_cache_config.kv_cache_groups))
        kv_binding.count_ascend_layers_on(self.ascend_kv, forward_context)
        return kv_caches

    def _init_kv_zero_meta(self) -> None:
        """vLLM's zeroer reads `layer.kv_cache[block]`; ours zeroes through the allocation (`block_zeroing`)."""
        self._ascend_zeroer = AscendBlockZeroer(self)

    def _zero_block_ids(self, block_ids: list[int]) -> None:
        """Hybrid models: zero the full-attention pages of blocks new to them, as vLLM's runners do."""
        if getattr(self, "_ascend_zeroer", None) is None:
            self._init_kv_zero_meta()
        self._ascend_zeroer.zero_block_ids(block_ids)

    def release_graphs(self) -> bool:
        """Sleep mode: drop the captured graphs of the static-graph wrappers (vLLM's compiled pieces); they recorded
        the addresses sleep frees. Returns whether there were graphs."""
        from ascend_platform.graph.wrapper import release_static_graphs

        dropped = release_static_graphs()
        usage.count("graphs.released", dropped)
        return dropped > 0

    def recapture_graphs(self) -> None:
        """Capture the graphs again on the memory wake-up gave the weights and the KV cache (vLLM's capture)."""
        self.capture_model()
        usage.count("graphs.recaptured")

    def release_kv_cache(self) -> None:
        kv_binding.connector_release_kv()
        kv_binding.detach_layer_kv(self.compilation_config.static_forward_context)
        self.kv_caches.clear()
        self.ascend_kv = None

    def reallocate_kv_cache(self) -> None:
        kv_caches = self.initialize_kv_cache_tensors(self.kv_cache_config, self._kernel_block_sizes)
        kv_binding.connector_register_kv(kv_caches)


class SimulatedModelRunnerV1(AscendRunnerV1Mixin, CPUModelRunner):
    """V1 runner on the CPU device (simulated-NPU lane). vLLM's CPU runner wraps no graphs, so sleep mode releases
    none here (`release_graphs` finds no wrapper) and never asks to capture again."""


class NPUModelRunnerV1(AscendRunnerV1Mixin, GPUModelRunner):
    """V1 runner on an NPU (torch_npu mirrors the CUDA runtime API the GPU runner uses)."""
