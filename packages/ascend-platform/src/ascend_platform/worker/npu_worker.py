"""`NPUWorker`: the Ascend worker on an NPU (torch_npu), on vLLM's GPU `Worker`."""

from __future__ import annotations

import gc
from typing import Any

import torch
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.gpu_worker import Worker, init_worker_distributed_environment

from ascend_platform import usage
from ascend_platform.patches import REGISTRY
from ascend_platform.worker.base import AscendWorkerMixin


class NPUWorker(AscendWorkerMixin, Worker):
    """The Ascend worker on an NPU (torch_npu); device setup follows vLLM's GPU worker."""

    def _runner_class(self, v2: bool) -> type:
        if v2:
            from ascend_platform.worker.model_runner_v2 import NPUModelRunnerV2

            return NPUModelRunnerV2
        from ascend_platform.worker.model_runner_v1 import NPUModelRunnerV1

        return NPUModelRunnerV1

    def init_device(self) -> None:
        """vLLM's `Worker.init_device` for a card: the card selected, the distributed groups formed, then the
        memory snapshot `determine_available_memory` measures against (`init_snapshot`, `requested_memory`), then
        the workspace manager and our runner (`_init_workspace_and_model_runner` calls `_make_model_runner`)."""
        from vllm.model_executor.model_loader import get_model_loader
        from vllm.utils.mem_utils import MemorySnapshot
        from vllm.v1.worker.utils import request_memory

        from ascend_platform.platform import NPUPlatform
        from ascend_platform.worker.npu_cuda_bridge import bridge_cuda_streams_to_npu
        from ascend_platform.worker.npu_group_capture import capture_groups_on_npu_streams
        from ascend_platform.worker.npu_mrv2_buffers import stage_mrv2_inputs_by_copy

        self._process_patches = [*bridge_cuda_streams_to_npu(), stage_mrv2_inputs_by_copy(),
                                 capture_groups_on_npu_streams()]
        self.device = torch.device(NPUPlatform.device_type, self.local_rank)
        NPUPlatform.set_device(self.device)
        usage.note("worker_device", str(self.device))
        NPUPlatform.check_if_supports_dtype(self.model_config.dtype)
        # The distributed groups first: their buffers belong to what the snapshot sees as already used.
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, NPUPlatform.dist_backend)
        set_random_seed(self.model_config.seed)
        gc.collect()
        torch.accelerator.empty_cache()
        external_weight_memory = get_model_loader(self.load_config).get_external_weight_memory(self.vllm_config)
        self.init_snapshot = MemorySnapshot(device=self.device)
        self.requested_memory = request_memory(self.init_snapshot, self.cache_config, external_weight_memory)
        usage.note("requested_memory", int(self.requested_memory))
        self._init_workspace_and_model_runner()

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            for handle in reversed(getattr(self, "_process_patches", ())):
                handle.undo()

    def _make_model_runner(self) -> Any:
        return self._build_runner()

    def compile_or_warm_up_model(self) -> Any:
        from ascend_platform.worker.npu_warmup import KERNEL_WARMUP, skip_cuda_kernel_warmup

        with REGISTRY.applied(KERNEL_WARMUP.name, skip_cuda_kernel_warmup):
            return super().compile_or_warm_up_model()
