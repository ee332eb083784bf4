"""`SimulatedAscendWorker`: the Ascend worker on the CPU device (simulated-NPU lane), on vLLM's `CPUWorker`.

Importing vLLM's CPU worker patches torch process-wide (`vllm.v1.worker.cpu.shm`: torch.Event, torch.cuda streams,
torch.accelerator's memory info and synchronize become CPU placeholders), so only a simulated-lane process imports
this module.
"""

from __future__ import annotations

import os

import torch
from vllm.distributed.parallel_state import get_pp_group  # noqa: F401  (before vLLM's CPU worker: its import order)
from vllm.logger import init_logger
from vllm.utils.torch_utils import set_random_seed
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_worker import init_worker_distributed_environment

from ascend_platform import usage
from ascend_platform.patches import REGISTRY
from ascend_platform.worker.base import AscendWorkerMixin
from ascend_platform.worker.cpu_threads import bind_worker_threads, ranks_on_this_node

logger = init_logger(__name__)


class SimulatedAscendWorker(AscendWorkerMixin, CPUWorker):
    """The Ascend worker on the CPU device (simulated-NPU lane)."""

    def _runner_class(self, v2: bool) -> type:
        if v2:
            from ascend_platform.worker.model_runner_v2 import SimulatedModelRunnerV2

            return SimulatedModelRunnerV2
        from ascend_platform.worker.model_runner_v1 import SimulatedModelRunnerV1

        return SimulatedModelRunnerV1

    def init_device(self) -> None:
        # CPUWorker.init_device minus its hard-wired runner: the same environment and distributed setup.
        from ascend_platform.platform import NPUPlatform

        self.device = torch.device("cpu")
        cpus = bind_worker_threads(self.local_rank, ranks_on_this_node(self.parallel_config))
        usage.note("worker_cpus", cpus)

        def skip_set_num_threads(n: int) -> None:
            logger.warning("torch.set_num_threads(%d) skipped after the CPU thread binding", n)

        init_method = self.distributed_init_method
        ident = (os.path.basename(init_method.removeprefix("file://")) if init_method.startswith("file://")
                 else init_method.split(":")[-1])
        if host := os.environ.get("VLLM_HOST_IP"):
            # Shared memory is per host: ranks of one TCP rendezvous on hosts that declare different addresses (a Ray
            # placement across hosts) must not agree on a segment name, or simulated hosts sharing this machine's
            # /dev/shm would all-reduce through it, which two machines cannot; they take gloo over the link instead.
            ident = f"{ident}-{host}"
        self._process_patches = [REGISTRY.apply("worker.torch_set_num_threads", skip_set_num_threads),
                                 REGISTRY.apply("worker.dist_ident", ident)]
        init_worker_distributed_environment(self.vllm_config, self.rank, self.distributed_init_method,
                                            self.local_rank, NPUPlatform.dist_backend)
        set_random_seed(self.model_config.seed)
        self.model_runner = self._build_runner()

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            for handle in reversed(getattr(self, "_process_patches", ())):
                handle.undo()
