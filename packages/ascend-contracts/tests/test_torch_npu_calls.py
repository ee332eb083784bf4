"""The torch_npu call-site scan and checker on synthetic modules, held to the 2.13.0 wheel's own schemas."""

from __future__ import annotations

import textwrap

from ascend_contracts.torch_npu_calls import module_loaders, scan_calls
from ascend_contracts.torch_npu_check import resolve_call
from ascend_contracts.torch_npu_wheel import TorchNpuWheel


def _scan(source: str):
    return scan_calls(textwrap.dedent(source), "mod.py")


def _problems(source: str, wheel: TorchNpuWheel) -> dict[int, list[str]]:
    """line -> the problems of the call there (empty list: accepted)."""
    out = {}
    for call in _scan(source):
        _, _, problems = resolve_call(call, wheel)
        out[call.line] = [p.detail for p in problems]
    return out


REACHES = """
import functools
import importlib
import torch
import torch_npu as tnpu
from torch_npu import atb
from torch_npu import npu_swiglu as swiglu

@functools.cache
def _torch_npu():
    return importlib.import_module("torch_npu")

def f(x, w):
    _torch_npu().npu_rms_norm(x, w, 1e-6)
    torch_npu = _torch_npu()
    torch_npu.npu_swiglu(x)
    tnpu.npu_swiglu(x, dim=-1)
    atb.npu_paged_cache_load(x, x, x, x)
    swiglu(x)
    getattr(tnpu, "npu_top_k_top_p")(x)
    torch.ops.npu.npu_swiglu.default(x)
    op = torch_npu.npu_rms_norm
    op(x, w)

def g(torch_npu):
    torch_npu.npu_swiglu(torch_npu)  # a parameter named torch_npu is not the module
"""


def test_every_way_of_reaching_torch_npu_is_found() -> None:
    calls = [(c.line, c.via, c.op, c.function) for c in _scan(REACHES)]
    assert calls == [
        (14, "torch_npu", "npu_rms_norm", "f"), (16, "torch_npu", "npu_swiglu", "f"),
        (17, "torch_npu", "npu_swiglu", "f"), (18, "torch_npu.atb", "npu_paged_cache_load", "f"),
        (19, "torch_npu", "npu_swiglu", "f"), (20, "torch_npu", "npu_top_k_top_p", "f"),
        (21, "torch.ops.npu", "npu_swiglu", "f"), (23, "torch_npu", "npu_rms_norm", "f"),
    ]


PLANTED = """
import importlib

_BAND = 4

def _torch_npu():
    return importlib.import_module("torch_npu")

def good(x, w, r, logits, ids, sinks, causal):
    out, _, res = _torch_npu().npu_add_rms_norm(x, r, w, 1e-6)
    kw = {"atten_mask": x, "sparse_mode": 3} if causal else {}
    kw["learnable_sink"] = sinks
    a, _ = _torch_npu().npu_fused_infer_attention_score_v2(x, x, x, input_layout="TND", num_query_heads=8, **kw)
    weights, ids, _ = _torch_npu().npu_moe_gating_top_k_softmax(logits, None, k=2)
    _torch_npu().npu_moe_init_routing_v2(x, ids, active_expert_range=[0, 8], expert_tokens_num_flag=True)
    _torch_npu().atb.npu_paged_cache_load(x, x, x, x, seq_starts=x, key=x, value=x)
    return _torch_npu().npu_rms_norm(x, w, 1e-6)[0]

def bad(x, w, r, logits, causal):
    _torch_npu().npu_rms_norm(x, w, eps=1e-6)
    _torch_npu().npu_rms_norm(x, w, 1e-6, True)
    _torch_npu().npu_moe_gating_top_k(x, 2, None)
    _torch_npu().npu_swiglu(x, dim="last")
    _torch_npu().npu_moe_gating_top_k(x, k=2.5, renorm=True)
    _torch_npu().npu_attention_update([x], [x])
    out, res = _torch_npu().npu_add_rms_norm(x, r, w)
    kw = {"atten_mask": x, "sparse_mode": _BAND * 1.5}
    kw.update(learnable_sinks=x)
    _torch_npu().npu_fused_infer_attention_score_v2(x, x, x, **kw)
    _torch_npu().npu_rms_norm(x, w)[2]
    _torch_npu().atb.npu_paged_cache_load(x, x, x, x, key=x)
"""


def test_correct_calls_pass_and_each_planted_mistake_is_named(wheel: TorchNpuWheel) -> None:
    found = _problems(PLANTED, wheel)
    assert all(found[line] == [] for line in (10, 13, 14, 15, 16, 17)), found
    assert found[20] == ["unknown keyword 'eps'; npu_rms_norm takes input, gamma, epsilon"]  # too short to match
    assert found[21] == ["4 positional arguments; npu_rms_norm takes at most 3 (input, gamma, epsilon)"]
    assert found[22] == ["keyword-only parameter(s) 'bias' passed by position (3 positional arguments; "
                         "npu_moe_gating_top_k takes 2)"]
    assert found[23] == ["'dim' is int, given a literal str"]
    assert found[24] == ["'k' is int, given a literal float", "'renorm' is int, given a literal bool"]
    assert found[25] == ["required parameter(s) 'update_type' not passed"]
    assert found[26] == ["result unpacked into 2 names; npu_add_rms_norm returns 3 (Tensor, Tensor, Tensor)"]
    assert found[29] == [  # the ** dict's keys and folded values are checked too
        "unknown keyword 'learnable_sinks'; npu_fused_infer_attention_score_v2 has 'learnable_sink'",
        "'sparse_mode' is int, given a literal float"]
    assert found[30] == ["result indexed [2]; npu_rms_norm returns 2"]
    # key without value fits no overload: the default one takes neither, .out needs both.
    assert found[31] == ["unknown keyword 'key'; npu_paged_cache_load takes key_cache, value_cache, block_table, "
                         "context_lens, seq_starts, cumsum"]


def test_an_unresolvable_kwargs_skips_only_the_required_check(wheel: TorchNpuWheel) -> None:
    source = """
    import torch_npu

    def f(x, opts):
        torch_npu.npu_attention_update([x], [x], **opts)
        torch_npu.npu_attention_update([x], [x], 0, bogus=1, **opts)
    """
    found = _problems(source, wheel)
    assert found == {5: [], 6: [found[6][0]]} and found[6][0].startswith("unknown keyword 'bogus'")


def test_an_overload_is_chosen_by_the_arguments(wheel: TorchNpuWheel) -> None:
    source = """
    import torch_npu

    def f(x):
        torch_npu.atb.npu_paged_cache_load(x, x, x, x)
        torch_npu.atb.npu_paged_cache_load(x, x, x, x, key=x, value=x)
    """
    assert [resolve_call(c, wheel)[0] for c in _scan(source)] == ["npu_paged_cache_load", "npu_paged_cache_load.out"]


def test_a_loader_imported_from_another_module_is_followed() -> None:
    backend = textwrap.dedent("""
        import importlib

        def _npu():
            return Counted(importlib.import_module("torch_npu"))
    """)
    binding = textwrap.dedent("""
        from pkg.backend import _npu

        def quant(x):
            return _npu().npu_dynamic_quant(x, quant_mode="pertensor")
    """)
    assert module_loaders(backend) == {"_npu"}
    assert scan_calls(binding, "pkg/binding.py") == []  # alone, the import says nothing
    calls = scan_calls(binding, "pkg/binding.py", frozenset({"pkg.backend._npu"}))
    assert [(c.op, c.function, sorted(c.keywords)) for c in calls] == [("npu_dynamic_quant", "quant", ["quant_mode"])]
