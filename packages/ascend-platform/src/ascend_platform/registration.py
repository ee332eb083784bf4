"""The `vllm.platform_plugins` entry point.

vLLM calls `register()` more than once and in every process, so it only answers a question: is there an Ascend
device (or an explicit simulated-NPU request)? It imports nothing heavy and changes nothing.
"""

from __future__ import annotations

import os

PLATFORM_CLASS = "ascend_platform.platform.NPUPlatform"
SIMULATE_ENV = "ASCEND_VLLM_SIMULATE"


def npu_unavailable_reason() -> str | None:
    """Why torch_npu cannot drive a device here, or None when it can."""
    from ascend_kernels.npu_probe import torch_npu_status

    status = torch_npu_status()
    return None if status.usable else status.reason


def simulate_requested() -> bool:
    return os.environ.get(SIMULATE_ENV, "").strip() == "1"


def register() -> str | None:
    """The platform class path when an Ascend NPU is usable or the simulated lane is switched on, else None."""
    if simulate_requested():
        return PLATFORM_CLASS
    return PLATFORM_CLASS if npu_unavailable_reason() is None else None
