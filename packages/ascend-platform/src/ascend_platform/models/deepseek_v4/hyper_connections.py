"""DeepSeek V4's hyper-connections (several residual streams mixed around each sublayer) on `ascend_kernels`.

vLLM's V4 layers call three custom ops: `mhc_pre` (mix the streams into a sublayer's input, plus the post and
combination weights), `mhc_post` (fold the sublayer's output back into the streams) and `hc_head` (collapse the
streams before the final norm). Their in-tree forwards are device kernels; the native ones take bfloat16 only
(`mhc_pre`) or do not exist (`hc_head`). These modules take their place in a built model, with the same call
signatures, and call the `dsv4_mhc_*` / `dsv4_hc_head` ops, which take any float dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_platform.facade import kernel_ops


class AscendMHCPre(torch.nn.Module):
    def forward(self, residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float, hc_post_mult_value: float,
                sinkhorn_repeat: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return kernel_ops().dsv4_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps, hc_pre_eps, hc_sinkhorn_eps,
                                         hc_post_mult_value, sinkhorn_repeat)


class AscendMHCPost(torch.nn.Module):
    def forward(self, x: torch.Tensor, residual: torch.Tensor, post_layer_mix: torch.Tensor,
                comb_res_mix: torch.Tensor) -> torch.Tensor:
        return kernel_ops().dsv4_mhc_post(x, residual, post_layer_mix, comb_res_mix)


class AscendHCHead(torch.nn.Module):
    def forward(self, hidden_states: torch.Tensor, hc_fn: torch.Tensor, hc_scale: torch.Tensor,
                hc_base: torch.Tensor, rms_norm_eps: float, hc_eps: float) -> torch.Tensor:
        return kernel_ops().dsv4_hc_head(hidden_states, hc_fn, hc_scale, hc_base, rms_norm_eps, hc_eps)


def adopt_hyper_connections(model: Any) -> None:
    """Replace the hyper-connection ops of a built V4 model (`DeepseekV4Model`) and its decoder layers. The fused
    post+pre op is vLLM's TileLang-only path; a layer set to use it is refused rather than left on it."""
    model.hc_head_op = AscendHCHead()
    for layer in model.layers:
        if not hasattr(layer, "mhc_pre"):  # a pipeline stage's missing layer
            continue
        if layer.use_fused_mhc:
            raise NotImplementedError(f"DeepSeek V4 layer {type(layer).__name__}: the fused mHC post+pre path "
                                      "(TileLang) has no Ascend op")
        layer.mhc_pre, layer.mhc_post = AscendMHCPre(), AscendMHCPost()
        del layer.mhc_fused_post_pre
