"""The NPU bindings of the int8 quant ops over the testkit's torch_npu (the 2.13.0 wheel's schemas and meta
functions): same results as the reference kernels, every call counted, no fallback for bfloat16 / float16."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import npu_backend, npu_quant, npu_usage
from ascend_kernels.reference import quant as ref
from ascend_testkit import torch_npu as fake


@pytest.fixture
def torch_npu():
    fake.uninstall()
    module = fake.install("tiny-models")
    npu_backend._torch_npu.cache_clear()
    npu_usage.reset()
    yield module
    fake.uninstall()
    npu_backend._torch_npu.cache_clear()


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def test_static_and_dynamic_quant_bind_and_match_the_reference(torch_npu):
    x = (torch.randn(6, 32, generator=_g()) * 2).to(torch.bfloat16)
    scale, offset = torch.tensor([0.03]), torch.tensor([-7.0])
    q = npu_quant.static_quant(x, scale, offset)
    # The kernel multiplies by the (bfloat16) reciprocal: at most one step away from dividing.
    assert q.dtype == torch.int8 and (q.int() - ref.static_quant(x, scale, offset).int()).abs().max() <= 1
    qd, sd = npu_quant.dynamic_quant(x)
    rq, rs = ref.dynamic_quant(x)
    assert torch.equal(qd, rq) and torch.allclose(sd, rs)
    assert npu_usage.snapshot()["npu_ops"] == {"npu_quantize": 1, "npu_dynamic_quant": 1}
    assert fake.calls()["npu_quantize"] == 1 and fake.calls()["npu_dynamic_quant"] == 1


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_quant_matmul_binds_per_token_and_float_bias(torch_npu, dtype):
    g = _g(1)
    x = torch.randint(-128, 128, (5, 64), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (24, 64), generator=g, dtype=torch.int8)  # checkpoint rows, passed as .t()
    scale, token, bias = torch.rand(24, generator=g) * 1e-3, torch.rand(5, generator=g), torch.randn(24, generator=g)
    out = npu_quant.quant_matmul(x, w.t(), scale, pertoken_scale=token, bias=bias.to(dtype), output_dtype=dtype)
    want = ref.quant_matmul(x, w.t(), scale, pertoken_scale=token, bias=bias, output_dtype=torch.float32)
    assert out.dtype == dtype and torch.allclose(out.float(), want, rtol=2e-2, atol=2e-2)
    assert npu_usage.snapshot()["fallbacks"] == {}


def test_quant_matmul_takes_an_int32_bias_in_the_kernel(torch_npu):
    g = _g(2)
    x = torch.randint(-128, 128, (3, 32), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (8, 32), generator=g, dtype=torch.int8)
    scale, quant_bias = torch.rand(8, generator=g) * 1e-3, torch.randint(-999, 999, (8,), generator=g,
                                                                          dtype=torch.int32)
    out = npu_quant.quant_matmul(x, w.t(), scale, bias=quant_bias, output_dtype=torch.bfloat16)
    want = ref.quant_matmul(x, w.t(), scale, bias=quant_bias, output_dtype=torch.float32)
    assert torch.allclose(out.float(), want, rtol=1e-2, atol=1e-2)
    assert npu_usage.snapshot()["npu_ops"] == {"npu_quant_matmul": 1}


def test_weight_quant_matmul_binds(torch_npu):
    g = _g(3)
    x = torch.randn(4, 32, generator=g).to(torch.bfloat16)
    w = torch.randint(-128, 128, (16, 32), generator=g, dtype=torch.int8)
    scale, offset = torch.rand(16, generator=g) * 1e-2, torch.randn(16, generator=g)
    out = npu_quant.weight_quant_matmul(x, w.t(), scale, offset)
    want = ref.weight_quant_matmul(x.float(), w.t(), scale, offset)
    assert out.dtype == torch.bfloat16 and torch.allclose(out.float(), want, rtol=2e-2, atol=5e-2)
    assert npu_usage.snapshot()["npu_ops"] == {"npu_weight_quant_batchmatmul": 1}


def test_float32_runs_the_reference_and_says_why(torch_npu):
    x = torch.randint(-128, 128, (3, 32), dtype=torch.int8)
    w = torch.randint(-128, 128, (32, 8), dtype=torch.int8)
    npu_quant.quant_matmul(x, w, torch.ones(8), output_dtype=torch.float32)
    snap = npu_usage.snapshot()
    assert snap["fallbacks"] == {"quant_matmul": 1} and "output_dtype torch.float32" in snap["fallback_reasons"][
        "quant_matmul"] and snap["npu_ops"] == {}
