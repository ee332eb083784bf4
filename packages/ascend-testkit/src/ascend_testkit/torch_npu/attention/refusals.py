"""The refusals a card makes, each naming the argument and the value it got.

ValueError: the card rejects the call (a bad layout, shape, dtype, mode, length list). NotImplementedError: the card
takes it but this fake does not model it (quantization, pse, shared prefixes, NZ caches), so a test never mistakes an
unmodelled path for a checked one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def dtype_names(dtypes: Sequence[torch.dtype]) -> str:
    return "/".join(str(d).removeprefix("torch.") for d in dtypes)


def refuse(op: str, message: str) -> None:
    raise ValueError(f"{op}: {message}")


def unmodelled(op: str, argument: str, value: object) -> None:
    raise NotImplementedError(f"{op}: {argument}={value!r} is accepted by the card but not modelled by this fake")


def require_contiguous(op: str, name: str, tensor: torch.Tensor | None) -> None:
    if tensor is not None and not tensor.is_contiguous():
        refuse(op, f"{name} must be contiguous, got shape {tuple(tensor.shape)} strides {tensor.stride()}")


def require_dtype(op: str, name: str, tensor: torch.Tensor, allowed: Sequence[torch.dtype]) -> None:
    if tensor.dtype not in allowed:
        refuse(op, f"{name} dtype must be one of {dtype_names(allowed)}, got {tensor.dtype}")


def require_dim(op: str, name: str, tensor: torch.Tensor, dims: Sequence[int]) -> None:
    if tensor.dim() not in dims:
        refuse(op, f"{name} must have {' or '.join(map(str, dims))} dims, got shape {tuple(tensor.shape)}")


def int_list(op: str, name: str, values: Sequence[int] | None) -> list[int] | None:
    if values is None:
        return None
    try:
        return [int(v) for v in values]
    except (TypeError, ValueError):
        refuse(op, f"{name} must be a list of ints, got {values!r}")
    raise AssertionError  # unreachable: refuse raises


def cumulative_lengths(op: str, name: str, values: list[int], *, total: int | None, exact: bool) -> list[int]:
    """Per-batch lengths from a cumulative list (TND): non-negative, non-decreasing, ending at (or within) total."""
    previous = 0
    lengths = []
    for index, value in enumerate(values):
        if value < previous:
            refuse(op, f"{name} is cumulative for TND and must be non-decreasing and >= 0, got {values} "
                   f"(element {index} = {value} after {previous})")
        lengths.append(value - previous)
        previous = value
    if total is not None and exact and previous != total:
        refuse(op, f"{name}[-1] must equal the token count {total}, got {values}")
    if total is not None and not exact and previous > total:
        refuse(op, f"{name}[-1] = {previous} exceeds the {total} rows given")
    return lengths


def per_batch_lengths(op: str, name: str, values: list[int] | None, *, batch: int, default: int,
                      capacity: int) -> list[int]:
    """Per-batch lengths (B-layouts, paged kv): None = the shape's length, one value = every batch, else the first B."""
    if values is None:
        return [default] * batch
    if len(values) == 1:
        lengths = values * batch
    elif len(values) >= batch:
        lengths = values[:batch]
    else:
        refuse(op, f"{name} must have 1 or at least {batch} (batch) elements, got {len(values)}: {values}")
    for index, value in enumerate(lengths):
        if not 0 <= value <= capacity:
            refuse(op, f"{name}[{index}] = {value} must be within [0, {capacity}]")
    return lengths
