"""HCCL process groups of the emulated cards: the `hccl` backend name torch_npu registers, made of gloo groups.

`init_process_group(backend="hccl")` and vLLM's device groups (`AscendNPUPlatform.dist_backend`) form as on a card.
Gloo moves host memory only, so each collective hands gloo host aliases of its `npu` tensors (`npu_emu::host_alias`:
CPU tensors over the card's memory, no copy): gloo reads and writes the card's tensors in place, as HCCL would.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

BACKEND = "hccl"
# What torch.distributed calls on a process group -> gloo's method taking the same arguments.
COLLECTIVES = {name: name for name in (
    "allreduce", "allreduce_coalesced", "allgather", "_allgather_base", "allgather_coalesced", "reduce_scatter",
    "_reduce_scatter_base", "broadcast", "reduce", "gather", "scatter", "alltoall", "alltoall_base", "send", "recv",
    "recv_anysource", "barrier")} | {"all_gather_single": "_allgather_base", "reduce_scatter_single":
                                     "_reduce_scatter_base", "all_to_all_single": "alltoall_base"}


def _host(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return torch.ops.npu_emu.host_alias(value) if value.device.type == "npu" else value
    if isinstance(value, list):
        return [_host(v) for v in value]
    return value


def _delegate(name: str, gloo_name: str):
    def collective(self, *args: Any) -> Any:
        return getattr(self._gloo, gloo_name)(*(_host(a) for a in args))

    collective.__name__ = name
    return collective


class HcclGroup(dist.ProcessGroup):
    """A gloo group under torch_npu's backend name; its collectives take `npu` tensors."""

    def __init__(self, store: Any, rank: int, size: int, timeout: Any) -> None:
        super().__init__(rank, size)
        self._gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        # torch keeps a group's name and sequence on its backends: gloo stands behind both device types (our
        # collectives above are what torch.distributed calls; they hand gloo host aliases).
        for device in ("cpu", "npu"):
            self._register_backend(torch.device(device), dist.ProcessGroup.BackendType.CUSTOM, self._gloo)

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND

    def name(self) -> str:
        return BACKEND


for _name, _gloo_name in COLLECTIVES.items():
    setattr(HcclGroup, _name, _delegate(_name, _gloo_name))


def register() -> None:
    if BACKEND in dist.Backend.backend_list:
        return
    dist.Backend.register_backend(BACKEND, HcclGroup, devices=["cpu", "npu"])
