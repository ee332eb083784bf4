"""Triton's interpreter goes on before any test module can import Triton: the float64 DeepSeek V4.1 reference is
anchored to vLLM's own Triton kernels, interpreted (ascend-kernels' `tests/vllm_triton.py`), which fail, not skip,
when something imported Triton first."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

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


@pytest.fixture(scope="module")
def torch_npu():
    """The testkit's torch_npu (tiny-model limits) installed for a module, the NPU backend's cached module and probe
    cleared around it (a module defining its own `torch_npu` fixture overrides this one)."""
    from ascend_kernels import npu_backend, npu_probe
    from ascend_testkit import torch_npu as fake

    module = fake.install("tiny-models")
    npu_backend._torch_npu.cache_clear()
    yield module
    fake.uninstall()
    npu_backend._torch_npu.cache_clear()
    npu_probe.torch_npu_status.cache_clear()
