"""Every op has an NPU binding, and reading the binding table does not import torch_npu."""

from __future__ import annotations

import subprocess
import sys

import ascend_kernels
from ascend_kernels.npu_backend import NPU_BINDINGS, npu_ops


def test_every_op_has_an_npu_binding_and_a_callable():
    assert set(NPU_BINDINGS) == set(ascend_kernels.OP_NAMES)
    table = npu_ops()
    assert set(table) == set(ascend_kernels.OP_NAMES)
    for name, binding in NPU_BINDINGS.items():
        assert binding.kind in ("torch_npu", "torch"), name
        if binding.kind == "torch_npu":
            assert binding.target.startswith("torch_npu."), name
        assert callable(table[name])


def test_binding_table_and_capabilities_load_without_torch_npu():
    code = (
        "import sys, ascend_kernels\n"
        "from ascend_kernels.npu_backend import NPU_BINDINGS, npu_ops\n"
        "npu_ops()\n"
        "assert all(ascend_kernels.supports(op, 'npu') for op in ascend_kernels.OP_NAMES)\n"
        "print(ascend_kernels.implementations('npu')['paged_attention'])\n"
        "assert 'torch_npu' not in sys.modules, 'torch_npu was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "npu_fused_infer_attention_score" in result.stdout
