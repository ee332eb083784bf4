"""Reference op of DeepSeek V4.1's delayed hyper-connections: the mHC pre block whose layer input is collapsed with the
PREVIOUS sublayer's pre coefficients while it returns this block's own for the next one. Contract in
`ascend_kernels.ops_dsv41`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_hyper import mix_coefficients, normalized_mixes
from ascend_kernels.reference.dsv4_layout import compute_dtype


def dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float,
                          hc_sinkhorn_eps: float, hc_post_mult_value: float, sinkhorn_repeat: int, pre_mix=None,
                          x=None, norm_weight=None, norm_eps: float = 1e-6):
    hc = residual.shape[1]
    ct = compute_dtype(residual.dtype)
    flat = (residual.flatten(1) if x is None else x).to(ct)
    pre, post, comb = mix_coefficients(normalized_mixes(flat, fn, rms_eps), hc, hc_scale.to(ct), hc_base.to(ct),
                                       hc_pre_eps, hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat)
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
