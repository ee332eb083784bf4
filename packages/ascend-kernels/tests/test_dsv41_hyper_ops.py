"""DeepSeek V4.1's delayed mHC pre block against a naive float64 formulation and against vLLM's own eager reference
(`mhc_pre_delayed_torch` in `vllm/model_executor/kernels/mhc/torch.py`, loaded from its file)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from ascend_kernels import ops

HC, HIDDEN, T = 2, 24, 5
MIX = (2 + HC) * HC
ARGS = (1e-6, 1e-2, 1e-6, 2.0, 3)  # rms_eps, hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat


def _vllm_mhc_torch():
    spec = importlib.util.find_spec("vllm")  # finds the package without executing it (importing vllm costs ~10 s)
    path = Path(spec.submodule_search_locations[0]) / "model_executor" / "kernels" / "mhc" / "torch.py"
    module_spec = importlib.util.spec_from_file_location("vllm_mhc_torch_reference_v41", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def _params(seed, input_size=HC * HIDDEN):
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(T, HC, HIDDEN, generator=gen)
    fn = torch.randn(MIX, input_size, generator=gen) * 0.05
    hc_scale = torch.rand(3, generator=gen) + 0.5
    hc_base = torch.randn(MIX, generator=gen) * 0.1
    pre_mix = torch.rand(T, HC, generator=gen) + 0.1
    return residual, fn, hc_scale, hc_base, pre_mix


def _naive(residual, fn, scale, base, rms_eps, pre_eps, sk_eps, post_mult, repeat, pre_mix, x, norm_w, norm_eps):
    """Per token in float64."""
    posts, combs, inputs, pres = [], [], [], []
    sig = lambda v: 1 / (1 + torch.exp(-v))  # noqa: E731
    for t in range(residual.shape[0]):
        r = residual[t].double()
        flat = r.flatten() if x is None else x[t].double()
        mixes = (fn.double() @ flat) / torch.sqrt(flat.square().mean() + rms_eps)
        s, b = scale.double(), base.double()
        pre = sig(mixes[:HC] * s[0] + b[:HC]) + pre_eps
        post = sig(mixes[HC:2 * HC] * s[1] + b[HC:2 * HC]) * post_mult
        logits = mixes[2 * HC:].view(HC, HC) * s[2] + b[2 * HC:].view(HC, HC)
        comb = torch.exp(logits - logits.max(1, keepdim=True).values)
        comb = comb / comb.sum(1, keepdim=True) + sk_eps
        comb = comb / (comb.sum(0, keepdim=True) + sk_eps)
        for _ in range(repeat - 1):
            comb = comb / (comb.sum(1, keepdim=True) + sk_eps)
            comb = comb / (comb.sum(0, keepdim=True) + sk_eps)
        collapsed = r[0] if pre_mix is None else sum(pre_mix[t, j].double() * r[j] for j in range(HC))
        if norm_w is not None:
            collapsed = collapsed / torch.sqrt(collapsed.square().mean() + norm_eps) * norm_w.double()
        posts.append(post.unsqueeze(-1))
        combs.append(comb)
        inputs.append(collapsed)
        pres.append(pre)
    return torch.stack(posts), torch.stack(combs), torch.stack(inputs), torch.stack(pres)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("with_pre_mix", [True, False])
def test_mhc_pre_delayed_matches_naive(dtype, with_pre_mix):
    residual, fn, hc_scale, hc_base, pre_mix = _params(0)
    residual = residual.to(dtype)
    pre_mix = pre_mix if with_pre_mix else None
    post, comb, layer_input, pre = ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, pre_mix)
    assert post.shape == (T, HC, 1) and comb.shape == (T, HC, HC) and layer_input.shape == (T, HIDDEN)
    assert pre.shape == (T, HC) and layer_input.dtype == dtype
    assert post.dtype == comb.dtype == pre.dtype == (torch.float64 if dtype == torch.float64 else torch.float32)
    expected = _naive(residual, fn, hc_scale, hc_base, *ARGS, pre_mix, None, None, 1e-6)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2}[dtype]
    for got, want in zip((post, comb, layer_input, pre), expected, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)
    if not with_pre_mix:  # model entry: the input is stream 0 itself, whatever the coefficients
        assert torch.equal(layer_input, residual[:, 0])


def test_mhc_pre_delayed_first_layer_input_and_norm():
    """V4.1's first layer: x = the embedding (every stream equal), fn summed over the copies; the same mixes as the
    broadcast residual with the full fn. With norm_weight the collapsed input is RMSNorm'd."""
    residual, fn, hc_scale, hc_base, pre_mix = _params(1)
    emb = residual[:, 0]
    broadcast = emb.unsqueeze(1).expand(-1, HC, -1).contiguous()
    fn_summed = fn.view(MIX, HC, HIDDEN).sum(1)
    norm_w = torch.rand(HIDDEN, generator=torch.Generator().manual_seed(3)) + 0.5
    got = ops.dsv41_mhc_pre_delayed(broadcast, fn_summed, hc_scale, hc_base, *ARGS, x=emb, norm_weight=norm_w,
                                    norm_eps=1e-5)
    full = ops.dsv41_mhc_pre_delayed(broadcast, fn, hc_scale, hc_base, *ARGS)
    for a, b in zip(got[:2] + got[3:], full[:2] + full[3:], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    want = _naive(broadcast, fn_summed, hc_scale, hc_base, *ARGS, None, emb, norm_w, 1e-5)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)
    # a pre_mix with the norm: sum_j pre_mix_j * r_j, then RMSNorm
    _, _, normed, _ = ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, pre_mix, norm_weight=norm_w)
    torch.testing.assert_close(normed.double(), _naive(residual, fn, hc_scale, hc_base, *ARGS, pre_mix, None,
                                                       norm_w, 1e-6)[2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("with_pre_mix", [True, False])
@pytest.mark.parametrize("with_x", [True, False])
def test_mhc_pre_delayed_matches_vllm_eager_reference(with_pre_mix, with_x):
    residual, fn, hc_scale, hc_base, pre_mix = _params(2)
    residual = residual.to(torch.bfloat16)
    pre_mix = pre_mix if with_pre_mix else None
    x = residual[:, 0].contiguous() if with_x else None
    fn = fn.view(MIX, HC, HIDDEN).sum(1) if with_x else fn
    want = _vllm_mhc_torch().mhc_pre_delayed_torch(residual, fn, hc_scale, hc_base, *ARGS, pre_mix=pre_mix, x=x)
    got = ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, pre_mix=pre_mix, x=x)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_mhc_pre_delayed_validation_names_the_argument():
    residual, fn, hc_scale, hc_base, pre_mix = _params(0)
    with pytest.raises(ValueError, match="dsv41_mhc_pre_delayed: argument 'pre_mix'"):
        ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, pre_mix[:, :1])
    with pytest.raises(ValueError, match="argument 'fn'"):
        ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, x=residual[:, 0])
    with pytest.raises(ValueError, match="argument 'norm_weight'"):
        ops.dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, *ARGS, norm_weight=torch.ones(HIDDEN + 1))
