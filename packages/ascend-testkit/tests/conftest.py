"""Triton's interpreter goes on before any test module can import Triton: the float64 DeepSeek V4.1 reference is
anchored to vLLM's own Triton kernels, interpreted (ascend-kernels' `tests/vllm_triton.py`), which fail, not skip,
when something imported Triton first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

KERNELS_LOADER = "ascend_kernels_tests_vllm_triton"


def kernels_loader():
    """ascend-kernels' anchor loader (tests-only tooling both packages' anchors share), loaded once per process."""
    module = sys.modules.get(KERNELS_LOADER)
    if module is None:
        path = Path(__file__).resolve().parents[2] / "ascend-kernels" / "tests" / "vllm_triton.py"
        spec = importlib.util.spec_from_file_location(KERNELS_LOADER, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[KERNELS_LOADER] = module
        spec.loader.exec_module(module)
    return module


kernels_loader().switch_on()
