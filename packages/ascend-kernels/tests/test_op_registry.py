"""The op registry: each op declared once, every view derived from the declarations, and one-hop dispatch."""

from __future__ import annotations

import importlib
import inspect
import re

import pytest
import torch

import ascend_kernels
from ascend_kernels import npu_backend, npu_usage, op_registry, ops, registry
from ascend_kernels import reference as ref
from ascend_kernels.op_registry import NpuBinding, kernel_op


def test_every_op_is_declared_once_with_a_reference_and_an_npu_binding():
    decls = op_registry.declarations()
    assert tuple(decls) == ascend_kernels.OP_NAMES == registry.OP_NAMES
    sources = {m: inspect.getsource(importlib.import_module(m)) for m in op_registry.OP_MODULES}
    declared_in_source = [name for text in sources.values()
                          for name in re.findall(r"^@kernel_op\(.*?^def (\w+)\(", text, re.S | re.M)]
    assert sorted(declared_in_source) == sorted(decls)  # one decorated contract per op, no other list
    for name, decl in decls.items():
        assert decl.module in op_registry.OP_MODULES and decl.contract.__doc__, name
        assert callable(decl.reference) and decl.reference.__module__.startswith("ascend_kernels.reference"), name
        assert isinstance(decl.npu, NpuBinding) and decl.npu.kind in ("torch_npu", "torch"), name
        assert decl.npu.kind == "torch" or decl.npu.impl, name
        assert getattr(ops, name) is not None  # `ops.<name>` for every family's op
    npu = op_registry.backend_impls("npu")
    assert set(npu) == set(decls) and all(callable(fn) for fn in npu.values())
    assert npu["paged_attention"] is npu_backend.paged_attention and npu["sample_greedy"] is ref.sample_greedy


def test_derived_views_match_the_declarations():
    decls = op_registry.declarations()
    assert {name: d.reference for name, d in decls.items()} == ref.REFERENCE_OPS
    assert {name: d.npu for name, d in decls.items()} == npu_backend.NPU_BINDINGS
    assert ascend_kernels.implementations("npu")["rms_norm"] == decls["rms_norm"].npu.target
    assert "paged_attention" in ascend_kernels.implementations("npu")
    assert "rms_norm" in ascend_kernels.implementations("reference")


def test_an_op_without_an_implementation_fails_at_registration_naming_it():
    before = dict(op_registry._DECLARATIONS)
    with pytest.raises(ValueError, match=r"kernel op 'brand_new_op': its torch_npu binding \(torch_npu.npu_x\) names "
                                         "no impl"):
        kernel_op(validate=None, reference=ref.rms_norm,
                  npu=NpuBinding(target="torch_npu.npu_x", kind="torch_npu"))(_renamed("brand_new_op"))
    with pytest.raises(TypeError, match="kernel op 'brand_new_op': reference implementation None is not callable"):
        kernel_op(validate=None, reference=None, npu=op_registry.reference_on_device("layers"))(
            _renamed("brand_new_op"))
    with pytest.raises(TypeError, match="kernel op 'brand_new_op': npu= must be an NpuBinding"):
        kernel_op(validate=None, reference=ref.rms_norm, npu="torch_npu.npu_x")(_renamed("brand_new_op"))
    with pytest.raises(TypeError, match="kernel op 'brand_new_op': validator .*check_paged_attention takes "
                                        "'query', which is not an argument of the op"):
        kernel_op(validate=ascend_kernels.validation.check_paged_attention, reference=ref.rms_norm,
                  npu=op_registry.reference_on_device("layers"))(_renamed("brand_new_op"))
    with pytest.raises(ValueError, match="kernel op 'rms_norm' is declared twice"):
        kernel_op(validate=None, reference=ref.rms_norm,
                  npu=op_registry.reference_on_device("layers"))(_renamed("rms_norm"))
    with pytest.raises(ValueError, match="NpuBinding kind 'cuda'"):
        NpuBinding(target="x", kind="cuda")
    assert before == op_registry._DECLARATIONS  # nothing half-registered


def _renamed(name):
    def contract(x, weight, eps, residual=None):
        """a contract"""

    contract.__name__ = contract.__qualname__ = name
    return contract


def test_checks_off_the_op_is_the_backends_function_itself():
    ascend_kernels.set_validation(False)
    try:
        for name in ascend_kernels.OP_NAMES:
            assert getattr(ops, name) is op_registry.declaration(name).reference, name
        module = importlib.import_module(op_registry.declaration("dsv4_mhc_pre").module)
        assert module.dsv4_mhc_pre is ops.dsv4_mhc_pre is ref.dsv4_mhc_pre
        # the npu backend's functions bound the same way (no torch_npu needed to bind, only to call)
        op_registry.bind(op_registry.backend_impls("npu"), checked=False)
        assert ops.paged_attention is npu_backend.paged_attention and ops.rms_norm is npu_backend.rms_norm
    finally:
        registry.rebind()
        ascend_kernels.set_validation(True)
    assert ops.rms_norm is not ref.rms_norm


def test_checks_on_a_generated_wrapper_checks_then_calls_the_implementation_directly():
    wrapper = ops.paged_attention
    assert inspect.signature(wrapper) == inspect.signature(op_registry.declaration("paged_attention").contract)
    assert wrapper.__globals__["_impl"] is ref.paged_attention  # one call from the wrapper to the kernel
    assert wrapper.__doc__ == op_registry.declaration("paged_attention").contract.__doc__


def test_validation_on_refuses_a_bad_argument_and_off_runs_it():
    x, bad_weight = torch.randn(3, 8), torch.ones(1)  # broadcastable, so the reference itself would run it
    with pytest.raises(ValueError, match=r"rms_norm: argument 'weight' has shape \(1,\).*expected \[8\]"):
        ops.rms_norm(x, bad_weight, 1e-6)
    ascend_kernels.set_validation(False)
    try:
        assert ops.rms_norm(x, bad_weight, 1e-6).shape == (3, 8)
    finally:
        ascend_kernels.set_validation(True)


def test_host_lists_are_checked_against_their_tensors():
    q = torch.randn(2, 2, 8)
    caches = torch.randn(2, 4, 1, 8), torch.randn(2, 4, 1, 8)
    args = (q, *caches, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32),
            torch.tensor([2], dtype=torch.int32))
    ops.paged_attention(*args, scale=0.5, query_start_loc_host=[0, 2], seq_lens_host=[2])
    with pytest.raises(ValueError, match="paged_attention: argument 'seq_lens_host'"):
        ops.paged_attention(*args, scale=0.5, seq_lens_host=[2, 3])


def test_a_facade_imported_before_selection_selects_the_default_and_follows_later_selections():
    registry._activate(None)  # as in a fresh process: no backend selected
    early = ops.rms_norm
    assert early is op_registry.declaration("rms_norm").facade
    x, w = torch.randn(2, 4), torch.ones(4)
    torch.testing.assert_close(early(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))
    assert ascend_kernels.get_backend() == "reference" and ops.rms_norm is not early
    ascend_kernels.set_validation(False)
    try:
        assert ops.rms_norm is ref.rms_norm
        torch.testing.assert_close(early(x, w, 1e-6), ref.rms_norm(x, w, 1e-6))  # still dispatches
    finally:
        ascend_kernels.set_validation(True)


def test_facade_counting_counts_per_backend_and_op_only_while_on():
    npu_usage.reset()
    x, w = torch.randn(2, 4), torch.ones(4)
    npu_usage.set_facade_counting(True)
    try:
        ops.rms_norm(x, w, 1e-6)
        ops.rms_norm(x, w, 1e-6, torch.zeros(2, 4))
        ops.silu_and_mul(torch.randn(2, 4))
        assert npu_usage.snapshot()["facade_ops"] == {"reference:rms_norm": 2, "reference:silu_and_mul": 1}
    finally:
        npu_usage.set_facade_counting(False)
    ops.rms_norm(x, w, 1e-6)
    assert npu_usage.snapshot()["facade_ops"]["reference:rms_norm"] == 2
    npu_usage.reset()



def test_an_op_observer_wraps_every_op_of_the_bound_backend_until_removed():
    seen: list[str] = []

    def observe(op):
        def wrap(fn):
            def observed(*args, **kwargs):
                seen.append(op)
                return fn(*args, **kwargs)

            return observed

        return wrap

    x, w = torch.randn(2, 4), torch.ones(4)
    expected = ops.rms_norm(x, w, 1e-6)
    registry.set_op_observer(observe)
    try:
        assert torch.equal(ops.rms_norm(x, w, 1e-6), expected)  # the observed op still returns the op's result
        ops.silu_and_mul(torch.randn(2, 4))
        npu_usage.set_facade_counting(True)  # both wrappers at once
        try:
            ops.rms_norm(x, w, 1e-6)
            assert npu_usage.snapshot()["facade_ops"].get("reference:rms_norm") == 1
        finally:
            npu_usage.set_facade_counting(False)
        assert seen == ["rms_norm", "silu_and_mul", "rms_norm"]
        ascend_kernels.set_backend("reference")  # selecting a backend again keeps the observer
        ops.silu_and_mul(torch.randn(2, 4))
        assert seen[-1] == "silu_and_mul"
    finally:
        registry.set_op_observer(None)
        npu_usage.reset()
    ops.rms_norm(x, w, 1e-6)
    assert len(seen) == 4

def test_each_backend_declares_the_kv_layout_it_takes():
    for backend in ascend_kernels.BACKEND_NAMES:
        layout = op_registry.kv_layout(backend)
        assert layout.contiguous
        assert layout.planes("attention") == {"key": ("num_blocks", "block_size", "num_kv_heads", "head_size"),
                                              "value": ("num_blocks", "block_size", "num_kv_heads", "head_size_v")}
        assert layout.planes("mla") == {"latent": ("num_blocks", "block_size", "1", "kv_lora_rank"),
                                        "rope": ("num_blocks", "block_size", "1", "rope_dim")}
    with pytest.raises(ValueError, match="unknown kernel backend 'cuda'"):
        op_registry.kv_layout("cuda")


def test_npu_callers_name_each_binding_function_with_the_ops_it_serves():
    callers = op_registry.npu_callers()
    assert callers["ascend_kernels.npu_backend:paged_attention"] == ("paged_attention",)
    assert callers["ascend_kernels.npu_backend:reshape_and_cache_mla"] == ("reshape_and_cache_mla",)
    served = [op for ops_ in callers.values() for op in ops_]
    kernels = [name for name, d in op_registry.declarations().items() if d.npu.kind == "torch_npu"]
    assert sorted(served) == sorted(n for n in op_registry.declarations() if op_registry.declaration(n).npu.impl)
    assert set(kernels) <= set(served)
