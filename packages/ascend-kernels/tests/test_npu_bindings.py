"""Every op has an NPU binding, and reading the binding table does not import torch_npu."""

from __future__ import annotations

import inspect
import logging
import re
import subprocess
import sys

import ascend_kernels
from ascend_kernels import npu_backend, npu_usage, op_registry
from ascend_kernels.npu_backend import NPU_BINDINGS


def test_every_op_has_an_npu_binding_and_a_callable():
    assert set(NPU_BINDINGS) == set(ascend_kernels.OP_NAMES)
    table = op_registry.backend_impls("npu")
    assert set(table) == set(ascend_kernels.OP_NAMES)
    for name, binding in NPU_BINDINGS.items():
        assert binding.kind in ("torch_npu", "torch"), name
        if binding.kind == "torch_npu":
            assert binding.target.startswith("torch_npu."), name
        assert callable(table[name])


def test_binding_table_and_capabilities_load_without_torch_npu():
    code = (
        "import sys, ascend_kernels\n"
        "from ascend_kernels import op_registry\n"
        "from ascend_kernels.npu_backend import NPU_BINDINGS\n"
        "op_registry.backend_impls('npu')\n"
        "assert set(ascend_kernels.implementations('npu')) == set(ascend_kernels.OP_NAMES)\n"
        "print(ascend_kernels.implementations('npu')['paged_attention'])\n"
        "assert 'torch_npu' not in sys.modules, 'torch_npu was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "npu_fused_infer_attention_score" in result.stdout


def test_every_torch_npu_call_is_counted():
    # Bindings reach torch_npu only through _npu(), whose calls are recorded in npu_usage (eagerly: inside a trace
    # into a compiled graph it hands over the module itself, which the backend's selection imported).
    import ast

    tree = ast.parse(inspect.getsource(npu_backend))
    loaders = {}
    for func in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for node in ast.walk(func):
            calls_loader = isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_torch_npu"
            imports = isinstance(node, ast.Import) and any(a.name == "torch_npu" for a in node.names)
            if calls_loader or imports:
                loaders.setdefault(func.name, []).append("import" if imports else "_torch_npu()")
    assert loaders == {"load_torch_npu": ["_torch_npu()"], "_npu": ["import", "_torch_npu()"]}, loaders
    for name, binding in NPU_BINDINGS.items():
        if binding.kind == "torch_npu":
            assert "_npu()." in _source_with_helpers(op_registry.backend_impls("npu")[name]), name


def _source_with_helpers(fn) -> str:
    """A binding's source and that of the module's private functions it calls (e.g. one kernel call shared by two
    paths of a binding)."""
    source = inspect.getsource(fn)
    helpers = {getattr(npu_backend, n, None) for n in re.findall(r"\b(_[a-z][a-z0-9_]*)\(", source)}
    return source + "".join(inspect.getsource(h) for h in helpers if inspect.isfunction(h))


def test_usage_counts_calls_and_fallbacks_and_warns_once(caplog):
    npu_usage.reset()
    with caplog.at_level(logging.WARNING, logger="ascend_kernels.npu_usage"):
        npu_usage.record_call("npu_rms_norm")
        npu_usage.record_fallback("fused_moe", "swiglu_limit")
        npu_usage.record_fallback("fused_moe", "swiglu_limit")
    assert npu_usage.snapshot() == {"npu_ops": {"npu_rms_norm": 1}, "fallbacks": {"fused_moe": 2},
                                    "fallback_reasons": {"fused_moe": "swiglu_limit"}, "facade_ops": {},
                                    "paged_planes": {}}
    assert [r.getMessage() for r in caplog.records].count(
        "ascend_kernels npu backend: fused_moe runs the reference implementation: swiglu_limit") == 1
    npu_usage.reset()
    assert npu_usage.snapshot() == {"npu_ops": {}, "fallbacks": {}, "fallback_reasons": {}, "facade_ops": {},
                                    "paged_planes": {}}
