"""The emulated card's C++ half (`csrc/npu_device.cpp`): built once per source and torch version, loaded per process.

Why C++: the device lane, and vLLM under it, create tensors on `current_platform.device_type` ("npu") themselves
(MRV2's staging buffers, pinned-memory copies, the graph pool), so the emulated card must be a real torch device.
Measured on this machine (tiny GEMM + SiLU + mul + add, 8x256, one thread): plain CPU ~40-46 us, this PrivateUse1
extension ~57 us (its boxed fallback runs each op on host aliases, ~3-4 us per op), a Python `__torch_dispatch__`
wrapper subclass ~233 us (~48 us per op, and its tensors have no storage, so `data_ptr()` users break); keeping
tensors on the CPU behind a seam (the first emulation) cannot run MRV2 at all (vLLM allocates on "npu").

The build takes ~20 s with the system C++ compiler and ninja (torch.utils.cpp_extension); later processes load the
cached library (torch's file lock serialises processes that start together).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import os
from pathlib import Path

import torch

SOURCE = "npu_device.cpp"
NAME = "ascend_testkit_npu_device"
BUILD_ENV = "ASCEND_TESTKIT_NPU_BUILD_DIR"


def _source() -> Path:
    return Path(str(importlib.resources.files("ascend_testkit.npu_runtime") / "csrc" / SOURCE))


def build_dir(source: Path) -> Path:
    """One folder per source text and torch build, under $ASCEND_TESTKIT_NPU_BUILD_DIR or the testkit's cache."""
    from ascend_testkit.models.checkpoint_cache import default_cache_root

    key = hashlib.sha256(source.read_bytes() + torch.__version__.encode()).hexdigest()[:16]
    root = Path(os.environ.get(BUILD_ENV) or default_cache_root() / "npu-device")
    folder = root / key
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def load() -> None:
    """Build (first time) and load the library; its static registrations run at load. Idempotent."""
    if hasattr(torch.ops, "npu_emu") and hasattr(torch.ops.npu_emu, "configure"):
        return
    from torch.utils import cpp_extension

    source = _source()
    try:
        cpp_extension.load(name=NAME, sources=[str(source)], build_directory=str(build_dir(source)),
                           extra_cflags=["-O2"], is_python_module=False, verbose=False)
    except (RuntimeError, OSError, FileNotFoundError) as exc:
        raise RuntimeError(f"the emulated NPU device ({source}) did not build: it needs a C++ compiler and ninja "
                           f"on PATH ({type(exc).__name__}: {exc})") from exc
