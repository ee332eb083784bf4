"""The three quantized linear forms both checkpoint formats reduce to, each through `ascend_kernels`' quant ops.

Every form takes the layer's input `[..., K]` and weights kept as the checkpoint's int8 `[N, K]` rows (passed to the
kernels as the `[K, N]` view); each kernel call is counted in `ascend_platform.usage` under `kernels.<op>`.
"""

from __future__ import annotations

import torch

from ascend_platform.facade import kernel_ops


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def static_w8a8(x: torch.Tensor, weight: torch.Tensor, input_scale: torch.Tensor, input_offset: torch.Tensor | None,
                deq_scale: torch.Tensor, quant_bias: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Per-tensor static activations: `(q(x) @ W + quant_bias) * deq_scale + bias`, q(x) = round(x / s) + offset;
    quant_bias (int32) carries the activation offset's correction, `-offset * rowsum(W)`."""
    ops = kernel_ops()
    rows = _rows(x)
    xq = ops.static_quant(rows, input_scale, input_offset)
    out = ops.quant_matmul(xq, weight.t(), deq_scale, bias=quant_bias, output_dtype=x.dtype)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])


def dynamic_w8a8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """Per-token dynamic activations: `(q(x) @ W) * weight_scale * token_scale + bias`."""
    ops = kernel_ops()
    rows = _rows(x)
    xq, token_scale = ops.dynamic_quant(rows)
    out = ops.quant_matmul(xq, weight.t(), weight_scale, pertoken_scale=token_scale, bias=bias,
                           output_dtype=x.dtype)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def weight_only_w8(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                   weight_offset: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    """Float activations, int8 weights dequantized per channel: `x @ ((W + offset) * scale) + bias`."""
    out = kernel_ops().weight_quant_matmul(_rows(x), weight.t(), weight_scale, weight_offset, bias)
    return out.reshape(*x.shape[:-1], weight.shape[0])


def offset_correction(weight: torch.Tensor, input_offset: torch.Tensor) -> torch.Tensor:
    """int32 `[N]`: `-offset * rowsum(W)`, what an asymmetric activation's zero point adds to each output."""
    return (-input_offset.to(torch.int64) * weight.to(torch.int64).sum(dim=1)).to(torch.int32)
