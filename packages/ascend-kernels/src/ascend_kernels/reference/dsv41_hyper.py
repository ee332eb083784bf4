"""Reference op of DeepSeek V4.1's delayed hyper-connections: the mHC pre block whose layer input is collapsed with the
PREVIOUS sublayer's pre coefficients while it returns this block's own for the next one. Contract in
`ascend_kernels.ops_dsv41`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import compute_dtype


def dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float,
                          hc_sinkhorn_eps: float, hc_post_mult_value: float, sinkhorn_repeat: int, pre_mix=None,
                          x=None, norm_weight=None, norm_eps: float = 1e-6):
    hc = residual.shape[1]
    ct = compute_dtype(residual.dtype)
    flat = (residual.flatten(1) if x is None else x).to(ct)
    # projection of the un-normalised rows, scaled by their rms after (vLLM's order)
    mixes = (flat @ fn.to(ct).t()) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + rms_eps)
    scale, base = hc_scale.to(ct), hc_base.to(ct)
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + hc_pre_eps
    post = torch.sigmoid(mixes[:, hc: 2 * hc] * scale[1] + base[hc: 2 * hc]) * hc_post_mult_value
    comb = mixes[:, 2 * hc:].view(-1, hc, hc) * scale[2] + base[2 * hc:].view(1, hc, hc)
    comb = torch.softmax(comb, dim=-1) + hc_sinkhorn_eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    for _ in range(sinkhorn_repeat - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + hc_sinkhorn_eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + hc_sinkhorn_eps)
    if pre_mix is None:
        collapsed = residual[:, 0].to(ct)
    else:
        collapsed = (pre_mix.to(ct).unsqueeze(-1) * residual.to(ct)).sum(dim=1)
    if norm_weight is not None:
        collapsed = collapsed * torch.rsqrt(collapsed.square().mean(-1, keepdim=True) + norm_eps) * norm_weight.to(ct)
    return post.unsqueeze(-1), comb, collapsed.to(residual.dtype), pre


def dsv41_hc_collapse(x, pre_mix):
    ct = compute_dtype(x.dtype)
    return (pre_mix.to(ct).unsqueeze(-1) * x.to(ct)).sum(dim=1).to(x.dtype)
