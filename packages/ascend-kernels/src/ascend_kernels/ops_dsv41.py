"""DeepSeek V4.1 ops of the kernel facade (re-exported by `ascend_kernels.ops`).

Each op mirrors one of vLLM 0.32's V4.1 torch / Triton functions argument for argument (named in its docstring; paths
relative to `vllm/`), in-place writes and return values included, so the model code swaps one call for the other.
Unlike upstream (bf16 activations, head_dim 512 and index head_dim 128 hard-coded) every op takes any float dtype
(float32 included; arithmetic in float32, float64 inputs in float64) and derives widths from its arguments. Where
upstream rounds through bf16 on purpose (the compressor latent, the index key) the ops round too. The ops V4.1 shares
with V4 (sparse MLA, the indexer query, paged MQA logits, top-k, inverse RoPE, mHC post) stay in
`ascend_kernels.ops_dsv4`.
"""

from __future__ import annotations

from ascend_kernels import validation_dsv41 as _vd
from ascend_kernels.registry import current_impl
from ascend_kernels.validation import SWITCH as _SWITCH

__all__ = [
    "dsv41_mhc_pre_delayed",
]


def dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float,
                          hc_sinkhorn_eps: float, hc_post_mult_value: float, sinkhorn_repeat: int, pre_mix=None,
                          x=None, norm_weight=None, norm_eps: float = 1e-6):
    """`model_executor/kernels/mhc/torch.py::mhc_pre_delayed_torch` (+ the tilelang variant's optional norm).

    residual float `[tokens, hc, hidden]`; x (optional) float `[tokens, input_size]`, the projection input instead of
    the flattened residual (V4.1's first layer: the raw embedding with fn summed over the copies); fn float `[(2 +
    hc) * hc, input_size]` (input_size = hc * hidden without x), hc_scale `[3]`, hc_base `[(2 + hc) * hc]`. mixes =
    `(x @ fn.T) * rsqrt(mean(x^2) + rms_eps)`; pre, post and comb as `dsv4_mhc_pre`. The layer input is collapsed
    with pre_mix float `[tokens, hc]` (the PREVIOUS sublayer's pre): `sum_j pre_mix[j] * residual[j]`, or
    `residual[:, 0]` when pre_mix is None (model entry); with norm_weight float `[hidden]` (vLLM's tilelang
    `norm_weight` / `norm_eps`) that input is RMSNorm'd. Returns (post float32 `[tokens, hc, 1]`, comb float32
    `[tokens, hc, hc]`, layer_input `[tokens, hidden]` in residual's dtype, pre float32 `[tokens, hc]`: this block's
    coefficients for the next sublayer); float64 residuals give float64 mixes.
    """
    if _SWITCH.enabled:
        _vd.check_mhc_pre_delayed(residual, fn, hc_scale, hc_base, sinkhorn_repeat, pre_mix, x, norm_weight,
                                  norm_eps)
    return current_impl().dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps,
                                                hc_sinkhorn_eps, hc_post_mult_value, sinkhorn_repeat, pre_mix, x,
                                                norm_weight, norm_eps)
