"""The NPU bindings of the quantized MoE ops over the testkit's torch_npu (npu_grouped_matmul's per-token int8 and
int8 x int4 forms, with the 2.13.0 wheel's schema and meta function): the reference kernels' results, no fallback;
the A8W4 form's assist bias is load-bearing, and what the fake does not model is named."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import npu_backend, npu_quant_moe, npu_usage
from ascend_kernels.reference import quant_moe as ref
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


def _pack_last(q):
    n = q.to(torch.int16) & 0xF
    return (n[..., 0::2] | (n[..., 1::2] << 4)).to(torch.uint8).view(torch.int8).contiguous()


def _experts(int4: bool, g):
    experts, hidden, inter = 4, 32, 16
    hi = 8 if int4 else 128
    w13 = torch.randint(-hi, hi, (experts, hidden, 2 * inter), generator=g, dtype=torch.int8)
    w2 = torch.randint(-hi, hi, (experts, inter, hidden), generator=g, dtype=torch.int8)
    s13, s2 = torch.rand(experts, 2 * inter, generator=g) * 1e-2, torch.rand(experts, hidden, generator=g) * 1e-2
    extra = dict(w13_bias=8 * s13 * w13.float().sum(1), w2_bias=8 * s2 * w2.float().sum(1)) if int4 else {}
    if int4:
        w13, w2 = _pack_last(w13), _pack_last(w2)
    return w13, w2, s13, s2, extra


@pytest.mark.parametrize("int4", [False, True])
def test_fused_moe_quant_binds_and_matches_the_reference(torch_npu, int4):
    g = torch.Generator().manual_seed(int(int4))
    w13, w2, s13, s2, extra = _experts(int4, g)
    x = torch.randn(6, 32, generator=g).to(torch.bfloat16)
    ids = torch.randint(0, 4, (6, 2), generator=g, dtype=torch.int32)
    ids[0, 1] = -1
    weights = torch.rand(6, 2, generator=g)
    out = npu_quant_moe.fused_moe_quant(x, w13, w2, s13, s2, weights, ids, int4=int4, **extra)
    want = ref.fused_moe_quant(x.float(), w13, w2, s13, s2, weights, ids, int4=int4, **extra)
    assert out.dtype == torch.bfloat16
    assert (out.float() - want).abs().max() <= 0.02 * want.abs().max()
    snap = npu_usage.snapshot()
    assert snap["fallbacks"] == {} and snap["npu_ops"]["npu_grouped_matmul"] == 2
    assert fake.calls()["npu_dynamic_quant"] == 2
    if int4:  # the A8W4 form without the right assist term gives another answer
        wrong = npu_quant_moe.fused_moe_quant(x, w13, w2, s13, s2, weights, ids, int4=True,
                                              w13_bias=extra["w13_bias"] * 0, w2_bias=extra["w2_bias"])
        assert (wrong.float() - out.float()).abs().max() > 0.1 * want.abs().max()


def test_unmodelled_grouped_matmul_arguments_are_named(torch_npu):
    x = torch.randint(-5, 5, (3, 8), dtype=torch.int8)
    w = torch.randint(-5, 5, (1, 8, 4), dtype=torch.int8)
    with pytest.raises(NotImplementedError, match="antiquant_scale"):
        torch_npu.npu_grouped_matmul([x.bfloat16()], [w.bfloat16()], antiquant_scale=[torch.ones(1, 4)],
                                     group_list=torch.tensor([3]), split_item=2, group_type=0, group_list_type=1)
    with pytest.raises(NotImplementedError, match="per_token_scale"):
        torch_npu.npu_grouped_matmul([x], [w], scale=[torch.ones(1, 4)], group_list=torch.tensor([3]),
                                     split_item=2, group_type=0, group_list_type=1, output_dtype=15)
