"""The bindings vLLM's compiled model pieces hold (norms, activation, rotary, int8 linears) trace into a graph whole
(`fullgraph=True`) over the schema-faithful torch_npu, and the graph computes what the eager bindings do: on a card
vLLM compiles the model around its attention op, so a binding that cannot be traced stops the engine there."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import npu_backend, npu_quant, npu_usage
from ascend_testkit import torch_npu as fake

HEADS, HEAD = 2, 16


@pytest.fixture(scope="module", autouse=True)
def torch_npu():
    module = fake.install("tiny-models")
    npu_backend._torch_npu.cache_clear()
    npu_backend.load_torch_npu()  # as the registry does when the npu backend is selected
    yield module
    fake.uninstall()
    npu_backend._torch_npu.cache_clear()


@pytest.fixture(autouse=True)
def _fresh(torch_npu):
    torch._dynamo.reset()
    npu_usage.reset()


def _rope_cache(rotary_dim: int, positions: int = 64) -> torch.Tensor:
    inv = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim))
    freqs = torch.outer(torch.arange(positions).float(), inv)
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1)


def _layer(x, weight, residual, positions, qkv, cos_sin, *, rotary_dim):
    normed, residual = npu_backend.rms_norm(x, weight, 1e-6, residual)
    q, k, _ = qkv.split([HEADS * HEAD] * 3, dim=-1)  # strided views of a fused projection, as vLLM hands them
    q, k = q.view(-1, HEADS, HEAD), k.view(-1, HEADS, HEAD)
    q, k = npu_backend.rotary_embedding(positions, q, k, cos_sin, head_size=HEAD, rotary_dim=rotary_dim,
                                        is_neox=True)
    return npu_backend.silu_and_mul(normed), residual, q.clone(), k.clone()


@pytest.mark.parametrize("rotary_dim", [HEAD, HEAD // 2])
def test_norm_rotary_and_activation_trace_whole_and_match_eager(rotary_dim):
    g = torch.Generator().manual_seed(0)
    tokens = 7
    args = (torch.randn(tokens, 64, generator=g).bfloat16(), torch.rand(64, generator=g).bfloat16() + 0.5,
            torch.randn(tokens, 64, generator=g).bfloat16(), torch.arange(tokens),
            torch.randn(tokens, 3 * HEADS * HEAD, generator=g).bfloat16(), _rope_cache(rotary_dim))
    eager = _layer(*[a.clone() for a in args], rotary_dim=rotary_dim)
    eager_fallbacks = npu_usage.snapshot()["fallbacks"]
    npu_usage.reset()
    compiled = torch.compile(_layer, fullgraph=True, backend="eager", dynamic=False)
    traced = compiled(*[a.clone() for a in args], rotary_dim=rotary_dim)
    for got, want in zip(traced, eager, strict=True):
        torch.testing.assert_close(got, want)
    # The partial rotary runs the reference in the graph too, and its fallback is counted when traced (once: a
    # replay runs no Python) and named.
    assert npu_usage.snapshot()["fallbacks"] == eager_fallbacks
    if rotary_dim < HEAD:
        assert npu_usage.snapshot()["fallback_reasons"]["rotary_embedding"].startswith("partial rotary")


def test_int8_linears_trace_whole_and_match_eager():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=g).bfloat16()
    weight = torch.randint(-127, 128, (32, 24), generator=g, dtype=torch.int8)
    scale = torch.rand(24, generator=g) * 0.01

    def linear(x):
        q, token_scale = npu_quant.dynamic_quant(x)
        return npu_quant.quant_matmul(q, weight, scale, pertoken_scale=token_scale, output_dtype=torch.bfloat16)

    eager = linear(x)
    traced = torch.compile(linear, fullgraph=True, backend="eager", dynamic=False)(x)
    torch.testing.assert_close(traced, eager)
    assert npu_usage.snapshot()["fallbacks"] == {}
