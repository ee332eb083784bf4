"""Int8 quantization ops of the kernel facade: activation quantizers and the W8A8 / W8A16 matmuls.

Layouts follow torch_npu's kernels (what the NPU bindings call): activations `[M, K]`, weights `[K, N]` (the `.t()`
view of a checkpoint's `[N, K]` int8 rows: no copy), per-output-channel vectors `[N]`, per-token vectors `[M]`.
int8 results are round-half-to-even, clamped to [-128, 127]; matmuls accumulate exactly in int32.
"""

from __future__ import annotations

import torch

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import NpuBinding, kernel_op
from ascend_kernels.reference import quant as _ref

_INT8 = "int8"


def _int8_2d(op: str, name: str, t, expected: str) -> None:
    _v.tensor(op, name, t, 2, expected)
    if t.dtype != torch.int8:
        _v.fail(op, name, t, f"{expected} of dtype {_INT8}")


def _vector(op: str, name: str, t, length: int, expected: str, *, allow_one: bool = False) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != 1 or not (t.shape[0] == length or (allow_one and t.shape[0] == 1)):
        _v.fail(op, name, t, expected)


def check_static_quant(x, scale, offset) -> None:
    op = "static_quant"
    _v.tensor(op, "x", x, 2, "[M, K] float")
    _v.floating(op, "x", x, "[M, K]")
    _vector(op, "scale", scale, 1, "a [1] float scale")
    if offset is not None:
        _vector(op, "offset", offset, 1, "a [1] zero point (or None)")


def check_dynamic_quant(x) -> None:
    _v.tensor("dynamic_quant", "x", x, 2, "[M, K] float")
    _v.floating("dynamic_quant", "x", x, "[M, K]")


def check_quant_matmul(x, weight, scale, pertoken_scale, bias, output_dtype) -> None:
    op = "quant_matmul"
    _int8_2d(op, "x", x, "[M, K]")
    _int8_2d(op, "weight", weight, f"[K={x.shape[1]}, N]")
    if weight.shape[0] != x.shape[1]:
        _v.fail(op, "weight", weight, f"[K={x.shape[1]}, N] int8")
    n = weight.shape[1]
    _vector(op, "scale", scale, n, f"a float32 [N={n}] (or [1]) dequant scale", allow_one=True)
    if scale.dtype != torch.float32:
        _v.fail(op, "scale", scale, f"a float32 [N={n}] (or [1]) dequant scale")
    if pertoken_scale is not None:
        _vector(op, "pertoken_scale", pertoken_scale, x.shape[0], f"a float32 [M={x.shape[0]}] per-token scale")
    if bias is not None:
        _vector(op, "bias", bias, n, f"a [N={n}] bias (int32: added before the dequant, float: after)")
    if output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        _v.fail(op, "output_dtype", output_dtype, "torch.float32, torch.float16 or torch.bfloat16")


def check_weight_quant_matmul(x, weight, antiquant_scale, antiquant_offset, bias) -> None:
    op = "weight_quant_matmul"
    _v.tensor(op, "x", x, 2, "[M, K] float")
    _v.floating(op, "x", x, "[M, K]")
    _int8_2d(op, "weight", weight, f"[K={x.shape[1]}, N]")
    if weight.shape[0] != x.shape[1]:
        _v.fail(op, "weight", weight, f"[K={x.shape[1]}, N] int8")
    n = weight.shape[1]
    _vector(op, "antiquant_scale", antiquant_scale, n, f"a [N={n}] scale")
    if antiquant_offset is not None:
        _vector(op, "antiquant_offset", antiquant_offset, n, f"a [N={n}] offset (or None)")
    if bias is not None:
        _vector(op, "bias", bias, n, f"a [N={n}] bias (or None)")


@kernel_op(validate=check_static_quant, reference=_ref.static_quant,
           npu=NpuBinding(target="torch_npu.npu_quantize", kind="torch_npu",
                          note="div_mode False with the float32 reciprocal scale and float32 zero point, qint8",
                          impl="ascend_kernels.npu_quant:static_quant"))
def static_quant(x, scale, offset=None) -> torch.Tensor:
    """Per-tensor static int8 quantization: `clamp(round(x / scale) + offset)`.

    x float `[M, K]`; scale float `[1]`; offset (zero point) `[1]` of any dtype holding an integer, or None
    (symmetric). Returns int8 `[M, K]`.
    """


@kernel_op(validate=check_dynamic_quant, reference=_ref.dynamic_quant,
           npu=NpuBinding(target="torch_npu.npu_dynamic_quant", kind="torch_npu", note="pertoken, int8",
                          impl="ascend_kernels.npu_quant:dynamic_quant"))
def dynamic_quant(x) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-token dynamic int8 quantization.

    x float `[M, K]`. Returns (int8 `[M, K]`, float32 scales `[M]`) with scale = max|row| / 127 and q = round(x /
    scale) (an all-zero row quantizes to zeros).
    """


@kernel_op(validate=check_quant_matmul, reference=_ref.quant_matmul,
           npu=NpuBinding(target="torch_npu.npu_quant_matmul", kind="torch_npu",
                          note="float32 scale; bfloat16 output, or float16 with per-token scales (float16 without "
                               "them needs an int64 scale: runs the reference); float32 output runs the reference",
                          impl="ascend_kernels.npu_quant:quant_matmul"))
def quant_matmul(x, weight, scale, *, pertoken_scale=None, bias=None, output_dtype=torch.bfloat16) -> torch.Tensor:
    """int8 x int8 matmul with dequantization: `((x @ weight) + int bias) * scale * pertoken_scale + float bias`.

    x int8 `[M, K]`; weight int8 `[K, N]` (a transposed view is fine); scale float32 `[N]` or `[1]` (per output
    channel / per tensor); pertoken_scale float32 `[M]` or None; bias `[N]`: int32 is added to the int32
    accumulator before the dequant (ModelSlim's `quant_bias`), a float bias after it. Returns `[M, N]` in
    output_dtype (float32, float16 or bfloat16).
    """


@kernel_op(validate=check_weight_quant_matmul, reference=_ref.weight_quant_matmul,
           npu=NpuBinding(target="torch_npu.npu_weight_quant_batchmatmul", kind="torch_npu",
                          note="per-channel antiquant scale/offset in x's dtype; float32 activations run the reference",
                          impl="ascend_kernels.npu_quant:weight_quant_matmul"))
def weight_quant_matmul(x, weight, antiquant_scale, antiquant_offset=None, bias=None) -> torch.Tensor:
    """Weight-only int8 matmul: `x @ ((weight + antiquant_offset) * antiquant_scale) + bias`.

    x float `[M, K]`; weight int8 `[K, N]`; antiquant_scale / antiquant_offset / bias `[N]` (offset and bias
    optional). Returns `[M, N]` in x's dtype.
    """
