"""DeepSeek V4.1's delayed hyper-connections (mHC) on `ascend_kernels`.

V4.1 keeps V4's residual streams and mixing weights but shifts the collapse by one sublayer: each sublayer's input
is the streams summed with the PREVIOUS sublayer's pre-mix (the attention uses the previous FFN's, the FFN this
layer's attention's), and the final hidden state is the streams collapsed with the last FFN's pre-mix (no learned
head). vLLM's kernels for this are TileLang/Triton (`nvidia/model.py`); these call the `dsv41_mhc_pre_delayed` /
`dsv41_hc_collapse` ops and V4's `dsv4_mhc_post`, which take any float dtype.
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops


def mhc_pre_delayed(residual: torch.Tensor, fn: torch.Tensor, hc_scale: torch.Tensor, hc_base: torch.Tensor,
                    rms_eps: float, hc_eps: float, hc_post_alpha: float, sinkhorn_iters: int,
                    pre_mix: torch.Tensor | None = None, x: torch.Tensor | None = None,
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(post [T,hc,1], comb [T,hc,hc], un-normed layer input [T,H], this sublayer's pre-mix [T,hc])."""
    return kernel_ops().dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps, hc_eps, hc_eps,
                                              hc_post_alpha, sinkhorn_iters, pre_mix, x)


def mhc_post(x: torch.Tensor, residual: torch.Tensor, post_mix: torch.Tensor, comb_mix: torch.Tensor) -> torch.Tensor:
    return kernel_ops().dsv4_mhc_post(x, residual, post_mix, comb_mix)


def hc_collapse(residual: torch.Tensor, pre_mix: torch.Tensor) -> torch.Tensor:
    return kernel_ops().dsv41_hc_collapse(residual, pre_mix)
