"""DeepSeek V4's hyper-connection ops against naive float64 formulations and against vLLM's own eager reference
(`vllm/model_executor/kernels/mhc/torch.py`, loaded from its file: importing the `vllm` package costs ~10 s)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ascend_kernels import ops

HC, HIDDEN = 4, 32
MIX = (2 + HC) * HC


def _vllm_mhc_torch():
    spec = importlib.util.find_spec("vllm")  # finds the package without executing it
    path = Path(spec.submodule_search_locations[0]) / "model_executor" / "kernels" / "mhc" / "torch.py"
    module_spec = importlib.util.spec_from_file_location("vllm_mhc_torch_reference", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _params(gen):
    residual = torch.randn(5, HC, HIDDEN, generator=gen)
    fn = torch.randn(MIX, HC * HIDDEN, generator=gen) * 0.05
    hc_scale = torch.rand(3, generator=gen) + 0.5
    hc_base = torch.randn(MIX, generator=gen) * 0.1
    return residual, fn, hc_scale, hc_base


def _naive_pre(residual, fn, scale, base, rms_eps, pre_eps, sk_eps, post_mult, repeat):
    """Per token in float64: rms-scaled projection, sigmoid gates, Sinkhorn-normalised softmax mixing matrix."""
    posts, combs, inputs = [], [], []
    for r in residual.double():
        flat = r.flatten()
        mixes = (fn.double() @ flat) / torch.sqrt(flat.square().mean() + rms_eps)
        pre = 1 / (1 + torch.exp(-(mixes[:HC] * scale[0].double() + base[:HC].double()))) + pre_eps
        post = 1 / (1 + torch.exp(-(mixes[HC:2 * HC] * scale[1].double() + base[HC:2 * HC].double()))) * post_mult
        logits = mixes[2 * HC:].view(HC, HC) * scale[2].double() + base[2 * HC:].double().view(HC, HC)
        comb = torch.exp(logits - logits.max(1, keepdim=True).values)
        comb = comb / comb.sum(1, keepdim=True) + sk_eps
        comb = comb / (comb.sum(0, keepdim=True) + sk_eps)
        for _ in range(repeat - 1):
            comb = comb / (comb.sum(1, keepdim=True) + sk_eps)
            comb = comb / (comb.sum(0, keepdim=True) + sk_eps)
        posts.append(post.unsqueeze(-1))
        combs.append(comb)
        inputs.append(sum(pre[i] * r[i] for i in range(HC)))
    return torch.stack(posts), torch.stack(combs), torch.stack(inputs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_pre_matches_naive_and_vllm(dtype):
    residual, fn, hc_scale, hc_base = _params(torch.Generator().manual_seed(0))
    residual = residual.to(dtype)
    args = (fn, hc_scale, hc_base, 1e-6, 1e-2, 1e-6, 2.0, 3)
    post, comb, layer_input = ops.dsv4_mhc_pre(residual, *args)
    assert post.shape == (5, HC, 1) and comb.shape == (5, HC, HC) and layer_input.shape == (5, HIDDEN)
    assert post.dtype == comb.dtype == torch.float32 and layer_input.dtype == dtype
    expected = _naive_pre(residual, *args)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=1e-2)
    for got, want in zip((post, comb, layer_input), expected, strict=True):
        torch.testing.assert_close(got.double(), want, **tol)
    if dtype == torch.bfloat16:  # vLLM's eager reference takes bfloat16 residuals only
        for got, want in zip((post, comb, layer_input), _vllm_mhc_torch().mhc_pre_torch(residual, *args),
                             strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mhc_post_matches_naive_and_vllm(dtype):
    gen = torch.Generator().manual_seed(1)
    residual = torch.randn(3, HC, HIDDEN, generator=gen).to(dtype)
    x = torch.randn(3, HIDDEN, generator=gen).to(dtype)
    post = torch.rand(3, HC, 1, generator=gen)
    comb = torch.rand(3, HC, HC, generator=gen)
    out = ops.dsv4_mhc_post(x, residual, post, comb)
    assert out.shape == residual.shape and out.dtype == dtype
    expected = torch.stack([torch.stack([sum(comb[t, i, j].double() * residual[t, i].double() for i in range(HC))
                                         + post[t, j, 0].double() * x[t].double() for j in range(HC)])
                            for t in range(3)])
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-2, atol=2e-2)
    torch.testing.assert_close(out.double(), expected, **tol)
    torch.testing.assert_close(out, _vllm_mhc_torch().mhc_post_torch(x, residual, post, comb), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_hc_head_reduces_the_streams_with_sigmoid_gates(dtype):
    gen = torch.Generator().manual_seed(2)
    hidden_states = torch.randn(4, HC, HIDDEN, generator=gen).to(dtype)
    hc_fn = torch.randn(HC, HC * HIDDEN, generator=gen) * 0.05
    hc_scale, hc_base = torch.rand(1, generator=gen) + 0.5, torch.randn(HC, generator=gen)
    out = ops.dsv4_hc_head(hidden_states, hc_fn, hc_scale, hc_base, 1e-6, 1e-2)
    assert out.shape == (4, HIDDEN) and out.dtype == dtype
    for t in range(4):
        flat = hidden_states[t].double().flatten()
        mixes = hc_fn.double() @ (flat / torch.sqrt(flat.square().mean() + 1e-6))
        pre = 1 / (1 + torch.exp(-(mixes * hc_scale.double() + hc_base.double()))) + 1e-2
        expected = sum(pre[i] * hidden_states[t, i].double() for i in range(HC))
        tol = dict(rtol=1e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[t].double(), expected, **tol)


def test_hyper_connection_ops_name_the_bad_argument():
    residual, fn, hc_scale, hc_base = _params(torch.Generator().manual_seed(3))
    with pytest.raises(ValueError, match="'fn'"):
        ops.dsv4_mhc_pre(residual, fn[1:], hc_scale, hc_base, 1e-6, 1e-2, 1e-6, 2.0, 3)
    with pytest.raises(ValueError, match="'comb_res_mix'"):
        ops.dsv4_mhc_post(residual[:, 0], residual, torch.ones(5, HC, 1), torch.ones(5, HC, HC + 1))
    with pytest.raises(ValueError, match="'hc_base'"):
        ops.dsv4_hc_head(residual, torch.zeros(HC, HC * HIDDEN), torch.ones(1), torch.zeros(HC + 1), 1e-6, 1e-2)
