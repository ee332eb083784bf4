"""The one place the device lane learns which torch.device its tensors live on.

On an Ascend host that is torch_npu's `npu:<local rank>`. A device runtime that backs the NPU with other storage (the
testkit's emulated NPU runtime, which keeps tensors on the CPU) says so once, through `back_npu_with`, before any
worker starts; everything else about the device (memory, streams, distributed backend) still goes through
`torch.npu` / `torch.accelerator` as on a card.
"""

from __future__ import annotations

import torch

_backing: list[torch.device] = []


def back_npu_with(device: torch.device | None) -> None:
    """`device` holds the NPU's tensors from now on; None: torch_npu's own `npu` device again."""
    _backing.clear()
    if device is not None:
        _backing.append(torch.device(device))


def worker_device(local_rank: int) -> torch.device:
    """The device an NPU worker of `local_rank` puts its tensors on."""
    if _backing:
        return _backing[0]
    return torch.device("npu", local_rank)


def npu_backing() -> torch.device | None:
    return _backing[0] if _backing else None
