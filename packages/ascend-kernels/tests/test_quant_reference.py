"""The int8 quantization ops against float64 formulations of their contracts, through the facade (reference)."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops, use_backend


@pytest.fixture(autouse=True)
def _reference():
    with use_backend("reference"):
        yield


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_static_quant_rounds_adds_the_offset_and_saturates():
    x = torch.tensor([[0.0, 0.26, -0.26, 0.5, 100.0, -100.0]], dtype=torch.bfloat16)
    scale, offset = torch.tensor([0.1]), torch.tensor([3.0])
    q = ops.static_quant(x, scale, offset)
    expected = torch.clamp(torch.round(x.double() / 0.1) + 3, -128, 127)
    assert q.dtype == torch.int8 and torch.equal(q.double(), expected)
    assert q[0, 4] == 127 and q[0, 5] == -128


def test_dynamic_quant_is_symmetric_per_token():
    x = torch.randn(7, 48, generator=_gen(), dtype=torch.float64).to(torch.bfloat16)
    x[3] = 0  # an all-zero row quantizes to zeros
    q, scale = ops.dynamic_quant(x)
    xd = x.double()
    want_scale = xd.abs().amax(dim=1) / 127
    assert scale.dtype == torch.float32 and torch.allclose(scale.double(), want_scale, rtol=1e-6)
    assert q.abs().amax(dim=1)[[0, 1, 2, 4, 5, 6]].eq(127).all() and not q[3].any()
    dequant = q.double() * scale.double()[:, None]
    assert (dequant - xd).abs().le(scale.double()[:, None] / 2 + 1e-6).all()


@pytest.mark.parametrize("m", [1, 5, 17, 40])
def test_quant_matmul_dequantizes_per_channel_and_per_token(m):
    g = _gen(m)
    k, n = 64, 24
    x = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w_rows = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)  # the checkpoint's [N, K]
    scale = torch.rand(n, generator=g) * 1e-3
    token = torch.rand(m, generator=g)
    bias = torch.randn(n, generator=g)
    out = ops.quant_matmul(x, w_rows.t(), scale, pertoken_scale=token, bias=bias, output_dtype=torch.float32)
    want = (x.double() @ w_rows.double().t()) * scale.double() * token.double()[:, None] + bias.double()
    assert out.dtype == torch.float32 and torch.allclose(out.double(), want, rtol=1e-5, atol=1e-5)


def test_quant_matmul_adds_an_int32_bias_before_the_dequant():
    g = _gen(1)
    x = torch.randint(-128, 128, (3, 32), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (32, 8), generator=g, dtype=torch.int8)
    scale = torch.rand(8, generator=g) * 1e-2
    quant_bias = torch.randint(-5000, 5000, (8,), generator=g, dtype=torch.int32)
    out = ops.quant_matmul(x, w, scale, bias=quant_bias, output_dtype=torch.bfloat16)
    want = (x.double() @ w.double() + quant_bias.double()) * scale.double()
    assert out.dtype == torch.bfloat16 and torch.allclose(out.double(), want, rtol=1e-2, atol=1e-2)


def test_static_w8a8_with_offset_correction_matches_the_float_product():
    """The ModelSlim / compressed-tensors static form: quantize with a zero point, correct by -zp * rowsum(W)."""
    g = _gen(2)
    x = torch.rand(6, 32, generator=g, dtype=torch.float64) * 3 - 0.5  # asymmetric range
    w = torch.randint(-128, 128, (16, 32), generator=g, dtype=torch.int8)
    w_scale = torch.rand(16, generator=g, dtype=torch.float64) * 1e-2
    s, zp = (x.max() - x.min()) / 255, torch.round(-128 - x.min() / ((x.max() - x.min()) / 255))
    q = ops.static_quant(x.float(), s.float().reshape(1), zp.float().reshape(1))
    corr = (-zp * w.double().sum(dim=1)).to(torch.int32)
    out = ops.quant_matmul(q, w.t(), (s * w_scale).float(), bias=corr, output_dtype=torch.float32)
    want = x @ (w.double() * w_scale[:, None]).t()
    assert (out.double() - want).abs().max() < 0.02 * want.abs().max()


def test_weight_quant_matmul_dequantizes_weights_per_channel():
    g = _gen(3)
    x = torch.randn(5, 32, generator=g)
    w = torch.randint(-128, 128, (32, 12), generator=g, dtype=torch.int8)
    scale, offset, bias = torch.rand(12, generator=g), torch.randn(12, generator=g), torch.randn(12, generator=g)
    out = ops.weight_quant_matmul(x, w, scale, offset, bias)
    want = x.double() @ ((w.double() + offset.double()) * scale.double()) + bias.double()
    assert torch.allclose(out.double(), want, rtol=1e-4, atol=1e-4)


def test_bad_arguments_are_named():
    x = torch.randint(-128, 128, (3, 32), dtype=torch.int8)
    with pytest.raises(ValueError, match="argument 'weight'.*K=32"):
        ops.quant_matmul(x, torch.zeros(16, 8, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="argument 'x'.*int8"):
        ops.quant_matmul(x.float(), torch.zeros(32, 8, dtype=torch.int8), torch.ones(8))
    with pytest.raises(ValueError, match="argument 'scale'"):
        ops.quant_matmul(x, torch.zeros(32, 8, dtype=torch.int8), torch.ones(8, dtype=torch.float64))
