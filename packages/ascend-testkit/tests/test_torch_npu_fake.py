"""The testkit torch_npu's own contract: ops bound to the wheel's schemas, outputs held to the wheel's meta
functions, torch_npu's module layout, counters, and install/uninstall."""

from __future__ import annotations

import sys

import pytest
import torch

from ascend_testkit import torch_npu as fake
from ascend_testkit.torch_npu import semantics
from ascend_testkit.torch_npu.library import MetaMismatchError


@pytest.fixture
def torch_npu():
    fake.uninstall()
    module = fake.install("tiny-models")
    yield module
    fake.uninstall()


def test_module_layout_follows_torch_npu(torch_npu):
    assert sys.modules["torch_npu"] is torch_npu and torch_npu.__version__ == "2.13.0"
    assert torch_npu.npu.device_count() == 1
    assert torch_npu.npu_rms_norm is torch.ops.npu.npu_rms_norm
    assert torch_npu._npu_reshape_and_cache is torch.ops.atb._npu_reshape_and_cache  # ATB API_LIST: top level
    assert torch_npu.atb.npu_paged_cache_load is torch.ops.atb.npu_paged_cache_load  # ATB_API_LIST: torch_npu.atb
    assert not hasattr(torch_npu, "npu_paged_cache_load")
    assert torch_npu.hifloat8 == 290  # torch_npu's dtype codes, read from its meta file


def test_wrong_keyword_fails_in_the_dispatcher(torch_npu):
    q = torch.randn(2, 2, 8)
    with pytest.raises(RuntimeError, match="Unknown keyword argument 'scale' for operator "
                                           "'npu::npu_fused_infer_attention_score_v2'"):
        torch_npu.npu_fused_infer_attention_score_v2(q, q, q, num_query_heads=2, input_layout="TND", scale=0.5,
                                                     actual_seq_qlen=[2], actual_seq_kvlen=[2])
    with pytest.raises(RuntimeError, match="npu_rms_norm"):
        torch_npu.npu_rms_norm(torch.randn(2, 4), torch.ones(4), "1e-6")  # a str where the schema says float


def test_unimplemented_op_is_defined_but_refuses_by_name(torch_npu):
    with pytest.raises(NotImplementedError, match="npu_gemma_rms_norm"):
        torch_npu.npu_gemma_rms_norm(torch.randn(2, 4), torch.ones(4))
    assert fake.calls()["npu_gemma_rms_norm"] == 1


def test_wrong_output_shape_fails_the_meta_check(monkeypatch):
    fake.uninstall()

    def halves_the_wrong_dim(*, input, dim):
        return input[..., : input.shape[0] // 2, :]

    monkeypatch.setitem(semantics.OWN, "npu_swiglu", halves_the_wrong_dim)
    module = fake.install("tiny-models")
    try:
        expected = r"npu_swiglu output 0: the fake gives shape \(2, 8\) .* torch_npu's meta function gives \(4, 4\)"
        with pytest.raises(MetaMismatchError, match=expected):
            module.npu_swiglu(torch.randn(4, 8))
    finally:
        fake.uninstall()


def test_documented_constraints_refuse_naming_the_argument(torch_npu):
    with pytest.raises(ValueError, match="npu_top_k_top_p: k must lie in"):
        torch_npu.npu_top_k_top_p(torch.randn(2, 8), None, torch.tensor([0, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match="cos_sin_cache must be"):
        q = torch.randn(2, 8)
        torch_npu._npu_rotary_embedding(torch.tensor([0, 1]), q, q.clone(), 8, torch.randn(4, 4), True)


def test_counts_reset_and_install_is_idempotent(torch_npu):
    torch_npu.npu_swiglu(torch.randn(2, 4))
    assert fake.install("tiny-models") is torch_npu
    assert fake.calls() == {"npu_swiglu": 1}
    fake.reset_calls()
    assert fake.calls() == {}
    with pytest.raises(RuntimeError, match="uninstall"):
        fake.install("card")


def test_uninstall_removes_module_and_ops():
    fake.uninstall()
    fake.install("card")
    fake.uninstall()
    fake.uninstall()
    assert "torch_npu" not in sys.modules and fake.calls() == {}
    assert not hasattr(torch.ops.npu, "npu_rms_norm") or not torch._C._dispatch_has_kernel_for_dispatch_key(
        "npu::npu_rms_norm", "CPU")


def test_status_names_what_is_modelled(torch_npu):
    status = fake.status()
    assert status["version"] == "2.13.0" and status["undefinable"] == {}
    assert "npu_rms_norm" in status["meta_checked"] and "_npu_reshape_and_cache" not in status["meta_checked"]
    assert "npu::fast_gelu" in status["meta_skipped"]  # a meta function for an op not named npu_*
