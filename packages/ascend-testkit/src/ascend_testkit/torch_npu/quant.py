"""torch_npu's int8 quantization kernels as their documentation (the wheel's _op_plugin_docs) states them, in the
int8 forms vllm-ascend's W8A8 / W8A8_DYNAMIC / W8A16 linears call; anything else is refused or named unmodelled.

- npu_quantize: div_mode True `input / scales + zero_points`, False `input * scales + zero_points`; rounded half to
  even, saturated to int8 (dtype qint8 = 12 or int8 = 1); scales / zero_points broadcast from [1] or along `axis`.
- npu_dynamic_quant (pertoken, int8): scale = rowMax(|x|) / 127 (float32, x's shape without the last dim),
  y = round(x / scale).
- npu_quant_matmul (int8 x1 [M, K], int8 x2 [K, N]): int32 accumulation; an int32 bias joins the accumulator, then
  `* scale` ([N] or [1]) `* pertoken_scale` ([M]); a float bias is added after; output float16 / bfloat16.
- npu_weight_quant_batchmatmul (float16 / bfloat16 x [M, K], int8 weight [K, N]): x @ ((weight + antiquant_offset)
  * antiquant_scale) + bias, per channel ([N] or [1, N]).
- npu_anti_quant (int8 x, up to 8 dims): `(x + offset) * scale` along the last axis; scale 1-D float32 / bfloat16
  of 1 or x.shape[-1] elements, offset (optional) of the scale's shape and dtype; output dst_dtype float16 (the
  default) or bfloat16. int4 packed in int32 (src_dtype quint4x2) is not modelled.
Computed in float64 (exact for int8 products at these sizes), independently of `ascend_kernels`' reference.
"""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype, unmodelled

_HALF = (torch.float16, torch.bfloat16)
_OUT_DTYPES = {5: torch.float16, 15: torch.bfloat16}


def _int8(values: torch.Tensor) -> torch.Tensor:
    return torch.round(values).clamp(-128, 127).to(torch.int8)


def npu_quantize(*, input, scales, zero_points, dtype, axis, div_mode):  # noqa: A002 (the schema's name)
    op = "npu_quantize"
    if dtype not in (1, 12):
        unmodelled(op, "dtype", dtype)
    require_dtype(op, "input", input, (torch.float32, *_HALF))
    if scales.numel() not in (1, input.shape[-1]):
        refuse(op, f"scales must have 1 or {input.shape[-1]} elements along the quantized axis, got "
                   f"{tuple(scales.shape)}")
    x = input.double()
    s = scales.double().reshape(-1)
    y = x / s if div_mode else x * s
    if zero_points is not None:
        if not div_mode and zero_points.dtype != scales.dtype:
            refuse(op, f"zero_points dtype must be scales' ({scales.dtype}) when div_mode is False, got "
                       f"{zero_points.dtype}")
        y = y + zero_points.double().reshape(-1)
    return _int8(y)


def npu_dynamic_quant(*, input, smooth_scales, group_index, dst_type, quant_mode, dst_type_max):  # noqa: A002
    op = "npu_dynamic_quant"
    for name, value in (("smooth_scales", smooth_scales), ("group_index", group_index)):
        if value is not None:
            unmodelled(op, name, "given")
    if dst_type not in (None, 1) or quant_mode != "pertoken":
        unmodelled(op, "dst_type/quant_mode", (dst_type, quant_mode))
    require_dtype(op, "input", input, _HALF)
    if input.dim() < 2:
        refuse(op, f"input must have more than one dim, got shape {tuple(input.shape)}")
    x = input.double()
    scale = x.abs().amax(dim=-1) / 127
    y = torch.where(scale[..., None] > 0, x / scale.clamp(min=1e-300)[..., None], torch.zeros_like(x))
    return _int8(y), scale.float()


def npu_quant_matmul(*, x1, x2, scale, offset, pertoken_scale, bias, output_dtype, x1_dtype, x2_dtype,
                     pertoken_scale_dtype, scale_dtype, group_sizes, y_scale):
    op = "npu_quant_matmul"
    for name, value in (("offset", offset), ("x1_dtype", x1_dtype), ("x2_dtype", x2_dtype),
                        ("pertoken_scale_dtype", pertoken_scale_dtype), ("scale_dtype", scale_dtype),
                        ("group_sizes", group_sizes), ("y_scale", y_scale)):
        if value is not None:
            unmodelled(op, name, "given")
    require_dtype(op, "x1", x1, (torch.int8,))
    require_dtype(op, "x2", x2, (torch.int8,))
    if output_dtype not in _OUT_DTYPES:
        unmodelled(op, "output_dtype", output_dtype)
    if x1.dim() != 2 or x2.dim() != 2 or x1.shape[1] != x2.shape[0]:
        refuse(op, f"x1 [M, K] and x2 [K, N] must agree on K, got {tuple(x1.shape)} and {tuple(x2.shape)}")
    n = x2.shape[1]
    require_dtype(op, "scale", scale, (torch.float32, torch.bfloat16))
    if scale.dim() != 1 or scale.shape[0] not in (1, n):
        refuse(op, f"scale must be 1-D of 1 or n={n} elements, got {tuple(scale.shape)}")
    if pertoken_scale is not None:
        require_dtype(op, "pertoken_scale", pertoken_scale, (torch.float32,))
        if pertoken_scale.shape != (x1.shape[0],):
            refuse(op, f"pertoken_scale must be [m={x1.shape[0]}], got {tuple(pertoken_scale.shape)}")
    acc = x1.double() @ x2.double()
    if bias is not None and bias.dtype == torch.int32:
        acc = acc + bias.double().reshape(-1)
    y = acc * scale.double()
    if pertoken_scale is not None:
        y = y * pertoken_scale.double()[:, None]
    if bias is not None and bias.dtype != torch.int32:
        y = y + bias.double().reshape(-1)
    return y.to(_OUT_DTYPES[output_dtype])


def npu_weight_quant_batchmatmul(*, x, weight, antiquant_scale, antiquant_offset, quant_scale, quant_offset, bias,
                                 antiquant_group_size, inner_precise, weight_dtype):
    op = "npu_weight_quant_batchmatmul"
    for name, value in (("quant_scale", quant_scale), ("quant_offset", quant_offset), ("weight_dtype", weight_dtype)):
        if value is not None:
            unmodelled(op, name, "given")
    if antiquant_group_size:
        unmodelled(op, "antiquant_group_size", antiquant_group_size)
    require_dtype(op, "x", x, _HALF)
    require_dtype(op, "weight", weight, (torch.int8,))
    if x.dim() != 2 or weight.dim() != 2 or x.shape[1] != weight.shape[0]:
        refuse(op, f"x (M, K) and weight (K, N) must agree on K, got {tuple(x.shape)} and {tuple(weight.shape)}")
    if antiquant_scale.dtype != x.dtype:
        refuse(op, f"antiquant_scale dtype must be x's ({x.dtype}), got {antiquant_scale.dtype}")
    w = weight.double()
    if antiquant_offset is not None:
        w = w + antiquant_offset.double().reshape(-1)
    y = x.double() @ (w * antiquant_scale.double().reshape(-1))
    if bias is not None:
        y = y + bias.double().reshape(-1)
    return y.to(x.dtype)


def npu_anti_quant(*, x, scale, offset, dst_dtype, src_dtype):
    op = "npu_anti_quant"
    if src_dtype not in (None, 1):
        unmodelled(op, "src_dtype", src_dtype)
    if x.dtype == torch.int32:
        unmodelled(op, "x dtype (int4 packed in int32)", x.dtype)
    require_dtype(op, "x", x, (torch.int8,))
    if not 1 <= x.dim() <= 8:
        refuse(op, f"x must have 1 to 8 dims, got shape {tuple(x.shape)}")
    require_dtype(op, "scale", scale, (torch.float32, torch.bfloat16))
    if scale.dim() != 1 or scale.shape[0] not in (1, x.shape[-1]):
        refuse(op, f"scale must be 1-D of 1 or {x.shape[-1]} (x's last dim) elements, got {tuple(scale.shape)}")
    if offset is not None and (offset.shape != scale.shape or offset.dtype != scale.dtype):
        refuse(op, f"offset must have scale's shape {tuple(scale.shape)} and dtype {scale.dtype}, got "
                   f"{tuple(offset.shape)} {offset.dtype}")
    out_dtype = _OUT_DTYPES.get(5 if dst_dtype is None else dst_dtype)
    if out_dtype is None:
        refuse(op, f"dst_dtype must be float16 (5) or bfloat16 (15), got {dst_dtype}")
    y = x.double()
    if offset is not None:
        y = y + offset.double()
    return (y * scale.double()).to(out_dtype)
