"""npu_rms_norm, npu_add_rms_norm and npu_swiglu as torch_npu documents them, computed in float32.

rstd is float32 with the normalised (gamma's) dims kept as size 1, as torch_npu's meta function shapes it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype

_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _check_gamma(op: str, x: torch.Tensor, gamma: torch.Tensor) -> None:
    require_dtype(op, "input" if op == "npu_rms_norm" else "x1", x, _FLOATS)
    if gamma.dim() == 0 or gamma.dim() > x.dim() or tuple(x.shape[x.dim() - gamma.dim():]) != tuple(gamma.shape):
        refuse(op, f"gamma shape {tuple(gamma.shape)} must equal the trailing dims of input {tuple(x.shape)}")
    if gamma.dtype not in (x.dtype, torch.float32):
        refuse(op, f"gamma dtype must be the input's ({x.dtype}) or float32, got {gamma.dtype}")


def _normalise(h: torch.Tensor, gamma: torch.Tensor, epsilon: float) -> tuple[torch.Tensor, torch.Tensor]:
    dims = tuple(range(h.dim() - gamma.dim(), h.dim()))
    rstd = torch.rsqrt(h.pow(2).mean(dim=dims, keepdim=True) + epsilon)
    return h * rstd * gamma.float(), rstd


def npu_rms_norm(*, input, gamma, epsilon):
    _check_gamma("npu_rms_norm", input, gamma)
    y, rstd = _normalise(input.float(), gamma, epsilon)
    return y.to(input.dtype), rstd


def npu_add_rms_norm(*, x1, x2, gamma, epsilon):
    _check_gamma("npu_add_rms_norm", x1, gamma)
    if x2.shape != x1.shape or x2.dtype != x1.dtype:
        refuse("npu_add_rms_norm", f"x2 must match x1 {tuple(x1.shape)} {x1.dtype}, got {tuple(x2.shape)} {x2.dtype}")
    h = x1.float() + x2.float()
    y, rstd = _normalise(h, gamma, epsilon)
    return y.to(x1.dtype), rstd, h.to(x1.dtype)


def npu_swiglu(*, input, dim):
    require_dtype("npu_swiglu", "input", input, _FLOATS)
    if input.dim() == 0 or input.shape[dim] % 2:
        refuse("npu_swiglu", f"input's dim {dim} must have an even size, got shape {tuple(input.shape)}")
    gate, up = input.float().chunk(2, dim=dim)
    return (F.silu(gate) * up).to(input.dtype)
