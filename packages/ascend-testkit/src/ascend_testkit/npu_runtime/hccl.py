"""HCCL process groups of the emulated cards: the `hccl` backend name torch_npu registers, here made of gloo groups,
so `init_process_group(backend="hccl")` and vLLM's groups on `AscendNPUPlatform.dist_backend` form as on a card."""

from __future__ import annotations

import torch.distributed as dist

BACKEND = "hccl"


def _gloo_group(store, rank: int, size: int, timeout):  # torch's creator signature (extended_api=False)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def register() -> None:
    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, _gloo_group, devices=["cpu", "npu"])
