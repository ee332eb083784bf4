"""The one place the device lane learns that its NPU is backed by another device.

On an Ascend host CANN runs the NPU kernels and triton-ascend compiles vLLM's Triton kernels for the card. A device
runtime that backs the `npu` device with the host (the testkit's emulated NPU: host memory behind a real `npu` torch
device, the CPU's kernels behind it) says so once, through `back_npu_with(torch.device("cpu"))`, before any worker
starts; the platform then runs vLLM's Triton kernels the host's way (`simulated.kernel_overrides`), as there is no
Triton device. Tensors, memory, streams, graphs and the distributed backend still go through the `npu` device and
`torch.npu` / `torch.accelerator`, as on a card.
"""

from __future__ import annotations

import torch

_backing: list[torch.device] = []


def back_npu_with(device: torch.device | None) -> None:
    """`device` runs the NPU's kernels from now on; None: the card's own (CANN, triton-ascend) again."""
    _backing.clear()
    if device is not None:
        _backing.append(torch.device(device))


def npu_backing() -> torch.device | None:
    return _backing[0] if _backing else None
