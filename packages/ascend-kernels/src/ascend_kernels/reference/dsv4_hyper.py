"""Reference ops of DeepSeek V4's hyper-connections (mHC): the pre block (mixing coefficients, Sinkhorn-normalised
residual mixing, the layer input), the post block and the head's reduction. Contracts in `ascend_kernels.ops_dsv4`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import compute_dtype


def normalized_mixes(flat: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """`(flat @ fn.T) / rms(flat)`: the projection of the un-normalised rows, scaled after (as vLLM orders it)."""
    return (flat @ fn.to(flat.dtype).t()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + eps)


def mix_coefficients(mixes, hc: int, scale, base, hc_pre_eps: float, hc_sinkhorn_eps: float,
                     hc_post_mult_value: float, sinkhorn_repeat: int):
    """(pre [T, hc], post [T, hc], comb [T, hc, hc] Sinkhorn-normalised) from the mixing projections `mixes`
    [T, (2 + hc) * hc]; shared by V4's mHC pre and V4.1's delayed one."""
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_pre_eps
    post = torch.sigmoid(mixes[:, hc: 2 * hc] * scale[1] + base[hc: 2 * hc]) * hc_post_mult_value
    comb = mixes[:, 2 * hc:].view(-1, hc, hc) * scale[2] + base[2 * hc:].view(1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + hc_sinkhorn_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    for _ in range(sinkhorn_repeat - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_sinkhorn_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    return pre, post, comb


def dsv4_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float,
                 hc_post_mult_value: float, sinkhorn_repeat: int):
    hc, hidden = residual.shape[-2:]
    outer = residual.shape[:-2]
    ct = compute_dtype(residual.dtype)
    x = residual.reshape(-1, hc, hidden).to(ct)
    pre, post, comb = mix_coefficients(normalized_mixes(x.flatten(1), fn, rms_eps), hc, hc_scale.to(ct),
                                       hc_base.to(ct), hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value,
                                       sinkhorn_repeat)
    layer_input = (pre.unsqueeze(-1) * x).sum(dim=1).to(residual.dtype)
    return post.view(*outer, hc, 1), comb.view(*outer, hc, hc), layer_input.view(*outer, hidden)


def dsv4_mhc_post(x, residual, post_layer_mix, comb_res_mix):
    ct = compute_dtype(residual.dtype)
    mixed = torch.einsum("...ij,...ih->...jh", comb_res_mix.to(ct), residual.to(ct))
    return (mixed + post_layer_mix.to(ct) * x.unsqueeze(-2).to(ct)).to(residual.dtype)


def dsv4_hc_head(hidden_states, hc_fn, hc_scale, hc_base, rms_norm_eps: float, hc_eps: float):
    hc, hidden = hidden_states.shape[-2:]
    outer = hidden_states.shape[:-2]
    ct = compute_dtype(hidden_states.dtype)
    x = hidden_states.reshape(-1, hc, hidden).to(ct)
    flat = x.flatten(1)
    mixes = (flat * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_norm_eps)) @ hc_fn.to(ct).t()
    pre = torch.sigmoid(mixes * hc_scale.to(ct)[0] + hc_base.to(ct)) + hc_eps
    return (pre.unsqueeze(-1) * x).sum(dim=1).to(hidden_states.dtype).view(*outer, hidden)
