"""Whether torch_npu imports and sees a device, and if not, why.

The only place outside the NPU backend that touches torch_npu, and only when asked: importing this module
imports nothing.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass


@dataclass(frozen=True)
class TorchNpuStatus:
    importable: bool
    device_count: int
    version: str | None
    reason: str | None  # None when usable

    @property
    def usable(self) -> bool:
        return self.importable and self.device_count > 0


@functools.cache
def torch_npu_status() -> TorchNpuStatus:
    if importlib.util.find_spec("torch_npu") is None:
        return TorchNpuStatus(False, 0, None, "torch_npu is not installed (pip install 'ascend-kernels[npu]')")
    try:
        import torch_npu  # registers the PrivateUse1 'npu' device
    except Exception as exc:  # e.g. OSError: libhccl.so missing when CANN is absent
        return TorchNpuStatus(False, 0, None, f"import torch_npu failed: {type(exc).__name__}: {exc}")
    version = getattr(torch_npu, "__version__", None)
    try:
        # torch_npu.npu is the module `torch.npu` points to once torch_npu is imported; asking it directly means a
        # stand-in torch_npu needs no attribute on torch.
        count = torch_npu.npu.device_count()
    except Exception as exc:
        return TorchNpuStatus(True, 0, version, f"torch_npu.npu.device_count() failed: {exc}")
    if count == 0:
        return TorchNpuStatus(True, 0, version, "torch_npu imports but sees no NPU device")
    return TorchNpuStatus(True, count, version, None)
