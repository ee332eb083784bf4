"""Quantized tiny Llamas served end to end: compressed-tensors int8 W8A8 on our platform (V1 and MRV2) against the
float64 reference of the checkpoint's own integers and per-token activations (dynamic; every host) or against plain
vLLM CPU on the same checkpoint (static); the ModelSlim twins token for token against their compressed-tensors
twins, weights kept int8 in memory, every quant op counted, and the NPU quant bindings run with nothing falling
back."""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

pytestmark = pytest.mark.engine

CT = ("ct_static", "ct_dynamic")
RUNNERS = ("v1", "v2")
# What each checkpoint's generation must count (ascend_platform.usage names: "kernels.<facade op>").
OPS = {"ct_static": {"kernels.static_quant", "kernels.quant_matmul"},
       "ct_dynamic": {"kernels.dynamic_quant", "kernels.quant_matmul"},
       "ms_static": {"kernels.static_quant", "kernels.quant_matmul"},
       "ms_dynamic": {"kernels.dynamic_quant", "kernels.quant_matmul"},
       "ms_mixed": {"kernels.static_quant", "kernels.dynamic_quant", "kernels.quant_matmul",
                    "kernels.weight_quant_matmul"}}
METHODS = {"ct_static": {"AscendCompressedInt8Method"}, "ct_dynamic": {"AscendCompressedInt8Method"},
           "ms_static": {"W8A8StaticLinear"}, "ms_dynamic": {"W8A8DynamicLinear"},
           "ms_mixed": {"W8A8StaticLinear", "W8A8DynamicLinear", "W8A16Linear", "UnquantizedLinearMethod"}}


@pytest.mark.parametrize("runner", RUNNERS)
def test_compressed_tensors_dynamic_matches_float64_with_the_same_integers(quant_runs, w8a8_references, runner):
    ours = quant_runs[(runner, "ct_dynamic")]
    assert ours["facts"]["runner"] == runner
    check_logprobs_close(ours["outputs"], w8a8_references["ct_dynamic"], name_0=f"ascend {runner}",
                         name_1="float64 W8A8 reference")


# Static only: plain vLLM CPU's dynamic per-token int8 GEMM (oneDNN) is exact only on hosts with VNNI (on AVX2 it
# sums u8 x s8 pairs in saturating int16: 0.21 relative error seen), so the dynamic checkpoint's anchor is the
# float64 reference above, on every host.
@pytest.mark.parametrize("runner", RUNNERS)
def test_compressed_tensors_static_matches_plain_vllm_cpu(quant_runs, runner):
    ours, anchor = quant_runs[(runner, "ct_static")], quant_runs[("cpu", "ct_static")]
    check_logprobs_close(ours["outputs"], anchor["outputs"], name_0=f"ascend {runner}", name_1="vLLM CPU (oneDNN)")
    assert ours["facts"]["runner"] == runner


@pytest.mark.parametrize(("modelslim", "twin"), [("ms_static", "ct_static"), ("ms_dynamic", "ct_dynamic")])
def test_modelslim_twin_gives_the_compressed_tensors_tokens(quant_runs, modelslim, twin):
    ms, ct = quant_runs[("v1", modelslim)], quant_runs[("v1", twin)]
    assert [o["token_ids"] for o in ms["outputs"]] == [o["token_ids"] for o in ct["outputs"]]


@pytest.mark.parametrize("model", [*CT, "ms_static", "ms_dynamic", "ms_mixed"])
def test_linear_weights_stay_int8_and_every_quant_op_is_counted(quant_runs, model):
    run = quant_runs[("v1", model)]
    linears = run["linears"]
    assert set(linears) == METHODS[model]
    for method, seen in linears.items():
        per_param = seen["bytes"] / seen["params"]
        if method == "UnquantizedLinearMethod":
            assert seen["dtypes"] == ["torch.bfloat16"] and per_param == 2
        else:
            assert seen["dtypes"] == ["torch.int8"] and per_param == 1, (method, seen)
    quant_counts = {k for k, n in run["counts"].items() if "quant" in k and n > 0}
    assert quant_counts == OPS[model], run["counts"]


def test_npu_quant_bindings_run_with_no_fallback(quant_runs):
    """The mixed checkpoint (all four quant ops) with kernel_backend npu over the testkit's torch_npu: the same
    outputs as the reference kernels, each quant kernel called, nothing falling back."""
    npu, reference = quant_runs[("npu", "ms_mixed")], quant_runs[("v1", "ms_mixed")]
    assert npu["facts"]["kernel_backend"] == "npu" and reference["facts"]["kernel_backend"] == "reference"
    ran = {op for op, n in npu["npu_ops"].items() if n}
    assert {"npu_quantize", "npu_dynamic_quant", "npu_quant_matmul", "npu_weight_quant_batchmatmul"} <= ran, ran
    assert npu["fallbacks"] == {}, npu["fallback_reasons"]
    check_logprobs_close(npu["outputs"], reference["outputs"], name_0="npu kernels", name_1="reference kernels")
