"""NPU bindings of the int8 quantization ops (`ascend_kernels.ops_quant`), over torch_npu 2.13.0's kernels:

    npu_quantize(Tensor input, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True)
    npu_dynamic_quant(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, int? dst_type=None,
                      str quant_mode="pertoken", float dst_type_max=0.0) -> (Tensor, Tensor)
    npu_quant_matmul(Tensor x1, Tensor x2, Tensor scale, *, Tensor? offset=None, Tensor? pertoken_scale=None,
                     Tensor? bias=None, int? output_dtype=None, ...)
    npu_weight_quant_batchmatmul(Tensor x, Tensor weight, Tensor antiquant_scale, Tensor? antiquant_offset=None,
                                 Tensor? quant_scale=None, Tensor? quant_offset=None, Tensor? bias=None, ...)

torch_npu is reached through `npu_backend._npu()` (counted per call); argument conventions follow vllm-ascend's
W8A8 / W8A8_DYNAMIC / W8A16 linear methods. Dtype arguments are torch_npu's ScalarType enum values (its meta
functions' TORCH_DTYPE_ENUM_VALUE_TO_SCALAR_TYPE_MAP). What a kernel cannot take runs the reference, recorded in
`npu_usage` with the reason.
"""

from __future__ import annotations

import torch

from ascend_kernels import npu_usage
from ascend_kernels.npu_backend import _npu
from ascend_kernels.reference import quant as _ref

_QINT8 = 12
_DTYPE_ENUM = {torch.float16: 5, torch.bfloat16: 15}
_HALF = (torch.float16, torch.bfloat16)


def static_quant(x, scale, offset=None):
    if x.dtype not in (*_HALF, torch.float32):
        npu_usage.record_fallback("static_quant", f"x dtype {x.dtype}: npu_quantize takes float/float16/bfloat16")
        return _ref.static_quant(x, scale, offset)
    # Multiply mode (vllm-ascend's call) with float32 scales and zero points (the kernel takes float scales for any
    # input dtype; zero points must share the scales' dtype): a bfloat16 reciprocal would shift every step by ~0.4%.
    recip = 1.0 / scale.float()
    zero = None if offset is None else offset.float()
    return _npu().npu_quantize(x, recip, zero, _QINT8, -1, False)


def dynamic_quant(x):
    if x.dtype not in _HALF:
        npu_usage.record_fallback("dynamic_quant", f"x dtype {x.dtype}: npu_dynamic_quant takes float16/bfloat16")
        return _ref.dynamic_quant(x)
    q, scale = _npu().npu_dynamic_quant(x)
    return q, scale


def quant_matmul(x, weight, scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16):
    reason = None
    if output_dtype not in _HALF:
        reason = f"output_dtype {output_dtype}: npu_quant_matmul writes float16/bfloat16 (or int8/int32)"
    elif output_dtype == torch.float16 and pertoken_scale is None:
        reason = "float16 output without per-token scales needs an int64 scale (npu_trans_quant_param)"
    if reason is not None:
        npu_usage.record_fallback("quant_matmul", reason)
        return _ref.quant_matmul(x, weight, scale, pertoken_scale=pertoken_scale, bias=bias,
                                 output_dtype=output_dtype)
    # An int32 bias goes into the kernel (added to the accumulator); a float one is added after it, which keeps
    # the call inside the dtype pairs every card takes.
    int_bias = bias if bias is not None and bias.dtype == torch.int32 else None
    out = _npu().npu_quant_matmul(x, weight, scale.float(), pertoken_scale=pertoken_scale, bias=int_bias,
                                  output_dtype=_DTYPE_ENUM[output_dtype])
    return out if bias is None or int_bias is not None else out + bias.to(output_dtype)


def weight_quant_matmul(x, weight, antiquant_scale, antiquant_offset=None, bias=None):
    if x.dtype not in _HALF:
        npu_usage.record_fallback("weight_quant_matmul",
                                  f"x dtype {x.dtype}: npu_weight_quant_batchmatmul takes float16/bfloat16")
        return _ref.weight_quant_matmul(x, weight, antiquant_scale, antiquant_offset, bias)
    offset = None if antiquant_offset is None else antiquant_offset.to(x.dtype)
    out = _npu().npu_weight_quant_batchmatmul(x, weight, antiquant_scale.to(x.dtype), offset)
    return out if bias is None else out + bias.to(x.dtype)
