"""Argument checks of the DeepSeek V4.1 ops (`ascend_kernels.ops_dsv41`): rank, shape, dtype and device only, as
`ascend_kernels.validation`."""

from __future__ import annotations

from ascend_kernels.validation import fail, floating, number, same_device, tensor


def _count(op: str, name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(op, name, value, f"an int >= {minimum}")


def _float_tensor(op: str, name: str, t: object, shape: tuple, dev, dims: str | None = None) -> None:
    """A float tensor of exactly `shape` (None entries: any size) on `dev` (None: any device)."""
    dims = dims or "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    tensor(op, name, t, len(shape), dims)
    floating(op, name, t, dims)
    if any(s is not None and s != got for s, got in zip(shape, t.shape, strict=True)):
        fail(op, name, t, dims)
    if dev is not None:
        same_device(op, name, t, dev, dims)


def check_mhc_pre_delayed(residual, fn, hc_scale, hc_base, sinkhorn_repeat, pre_mix, x, norm_weight,
                          norm_eps) -> None:
    op = "dsv41_mhc_pre_delayed"
    _float_tensor(op, "residual", residual, (None, None, None), None, "[tokens, hc, hidden]")
    t, hc, hidden = residual.shape
    dev = residual.device
    mix = (2 + hc) * hc
    if x is not None:
        _float_tensor(op, "x", x, (t, None), dev, f"[{t}, input_size]")
    width = hc * hidden if x is None else x.shape[1]
    _float_tensor(op, "fn", fn, (mix, width), dev)
    _float_tensor(op, "hc_scale", hc_scale, (3,), dev)
    _float_tensor(op, "hc_base", hc_base, (mix,), dev)
    _count(op, "sinkhorn_repeat", sinkhorn_repeat)
    if pre_mix is not None:
        _float_tensor(op, "pre_mix", pre_mix, (t, hc), dev)
    if norm_weight is not None:
        _float_tensor(op, "norm_weight", norm_weight, (hidden,), dev)
        number(op, "norm_eps", norm_eps, "a positive real number", positive=True)


