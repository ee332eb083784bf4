"""Reference int8 quantization kernels: activation quantizers and the two quantized matmuls of W8A8 / W8A16 linears.

Conventions (those of torch_npu's npu_quantize / npu_dynamic_quant / npu_quant_matmul / npu_weight_quant_batchmatmul,
which the NPU bindings call): weights are `[K, N]` (the transposed view of a checkpoint's `[N, K]` rows is fine: no
copy), activations `[M, K]`; int8 values are clamped to [-128, 127] after round-half-to-even.
"""

from __future__ import annotations

import torch

_INT8_MIN, _INT8_MAX = -128, 127


def static_quant(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None = None) -> torch.Tensor:
    """`round(x / scale) + offset`, clamped to int8; one scale (and offset) for the whole tensor."""
    q = torch.round(x.float() / scale.float())
    if offset is not None:
        q = q + offset.float()
    return q.clamp_(_INT8_MIN, _INT8_MAX).to(torch.int8)


def dynamic_quant(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token int8: scale = rowmax|x| / 127 (float32 `[M]`), q = round(x / scale)."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / _INT8_MAX
    # An all-zero row quantizes to zeros with any positive scale; 1 keeps the division finite.
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(xf / safe.unsqueeze(-1)).clamp_(_INT8_MIN, _INT8_MAX).to(torch.int8)
    return q, scale


def _int8_matmul(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    # torch._int_mm (int8 x int8 -> int32, exact) takes M > 16 on some CPU builds only; small M pads the rows.
    m = x.shape[0]
    if m > 16:
        return torch._int_mm(x.contiguous(), weight)
    padded = torch.zeros(17, x.shape[1], dtype=torch.int8, device=x.device)
    padded[:m] = x
    return torch._int_mm(padded, weight)[:m]


def quant_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, *,
                 pertoken_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                 output_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """`((x @ weight) [+ int32 bias]) * scale [* pertoken_scale] [+ float bias]` in float32, cast to output_dtype."""
    acc = _int8_matmul(x, weight)
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias
    # One [M, N] multiply (int32 x float32 promotes in the kernel): on a loaded host each elementwise pass costs a
    # scheduler slice at its OpenMP barrier, which dominated the decode-sized matmul.
    factor = scale.float() if pertoken_scale is None else pertoken_scale.float().unsqueeze(-1) * scale.float()
    out = torch.mul(acc, factor)
    if bias is not None and bias.dtype != torch.int32:
        out = out + bias.float()
    return out.to(output_dtype)


def weight_quant_matmul(x: torch.Tensor, weight: torch.Tensor, antiquant_scale: torch.Tensor,
                        antiquant_offset: torch.Tensor | None = None,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ ((weight + antiquant_offset) * antiquant_scale) + bias`, per output channel, in x's dtype."""
    w = weight.to(x.dtype)
    if antiquant_offset is not None:
        w = w + antiquant_offset.to(x.dtype)
    out = x @ (w * antiquant_scale.to(x.dtype))
    return out if bias is None else out + bias.to(x.dtype)
