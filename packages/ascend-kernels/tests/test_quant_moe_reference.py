"""The quantized MoE ops (reference backend, through the facade) against float64 formulations of their contracts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ascend_kernels import ops, use_backend


@pytest.fixture(autouse=True)
def _reference():
    with use_backend("reference"):
        yield


def _int4_rows(rows: int, cols: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(-8, 8, (rows, cols), generator=g, dtype=torch.int8)


def _pack_last(q: torch.Tensor) -> torch.Tensor:
    """Two int4 per byte along the last dim, element 2j in the low nibble (written independently of the op)."""
    n = q.to(torch.int16) & 0xF
    return (n[..., 0::2] | (n[..., 1::2] << 4)).to(torch.uint8).view(torch.int8)


def test_unpack_int4_reads_low_nibble_first_and_sign_extends():
    packed = torch.tensor([[0x21, -1, 0x7F, -128]], dtype=torch.int16).to(torch.int8)
    assert ops.unpack_int4(packed).tolist() == [[1, 2, -1, -1, -1, 7, 0, -8]]
    q = _int4_rows(6, 10, torch.Generator().manual_seed(0))
    assert torch.equal(ops.unpack_int4(_pack_last(q)), q)


@pytest.mark.parametrize("int4", [False, True])
def test_grouped_quant_matmul_dequantizes_per_expert_channel_and_token(int4):
    g = torch.Generator().manual_seed(int(int4))
    experts, k, n, counts = 3, 16, 8, [2, 0, 3]
    m = sum(counts) + 1  # one row past the groups
    x = torch.randint(-128, 128, (m, k), generator=g, dtype=torch.int8)
    w = (torch.stack([_int4_rows(k, n, g) for _ in range(experts)]) if int4
         else torch.randint(-128, 128, (experts, k, n), generator=g, dtype=torch.int8))
    scale, token = torch.rand(experts, n, generator=g) * 1e-2, torch.rand(m, generator=g)
    bias = 8 * scale * w.float().sum(dim=1) if int4 else None  # the assist term ModelSlim writes
    out = ops.grouped_quant_matmul(x, _pack_last(w) if int4 else w, scale, token, torch.tensor(counts), int4=int4,
                                   bias=bias, output_dtype=torch.float32)
    start = 0
    for e, c in enumerate(counts):
        want = (x[start:start + c].double() @ w[e].double()) * scale[e].double() * token[start:start + c, None]
        assert torch.allclose(out[start:start + c].double(), want, rtol=1e-5, atol=1e-4)
        start += c
    assert not out[start:].any()


def test_int4_grouped_matmul_needs_its_assist_term():
    x = torch.ones(1, 4, dtype=torch.int8)
    with pytest.raises(ValueError, match="bias"):
        ops.grouped_quant_matmul(x, torch.zeros(1, 4, 1, dtype=torch.int8), torch.ones(1, 2), torch.ones(1),
                                 torch.tensor([1]), int4=True)


@pytest.mark.parametrize("int4", [False, True])
def test_fused_moe_quant_is_the_quantized_expert_mlp(int4):
    g = torch.Generator().manual_seed(7)
    experts, hidden, inter, t, k = 4, 16, 8, 5, 2
    hi = 8 if int4 else 128
    w13 = torch.randint(-hi, hi, (experts, hidden, 2 * inter), generator=g, dtype=torch.int8)
    w2 = torch.randint(-hi, hi, (experts, inter, hidden), generator=g, dtype=torch.int8)
    s13, s2 = torch.rand(experts, 2 * inter, generator=g) * 1e-2, torch.rand(experts, hidden, generator=g) * 1e-2
    x = torch.randn(t, hidden, generator=g)
    ids = torch.randint(0, experts, (t, k), generator=g, dtype=torch.int32)
    ids[1, 0] = -1  # an expert of another rank
    weights = torch.rand(t, k, generator=g)
    extra = dict(w13_bias=8 * s13 * w13.float().sum(1), w2_bias=8 * s2 * w2.float().sum(1)) if int4 else {}
    out = ops.fused_moe_quant(x, _pack_last(w13) if int4 else w13, _pack_last(w2) if int4 else w2, s13, s2, weights,
                              ids, int4=int4, **extra)

    def q(v):  # symmetric per-token int8 round trip
        s = v.abs().amax(-1, keepdim=True) / 127
        return torch.round(v / s) * s

    want = torch.zeros(t, hidden, dtype=torch.float64)
    for i in range(t):
        for j in range(k):
            e = int(ids[i, j])
            if e < 0:
                continue
            gu = q(x[i].double()) @ (w13[e].double() * s13[e].double())
            act = F.silu(gu[:inter]) * gu[inter:]
            want[i] += weights[i, j].double() * (q(act) @ (w2[e].double() * s2[e].double()))
    assert torch.allclose(out.double(), want, rtol=1e-3, atol=1e-3 * want.abs().max().item())
