"""Adapters for vLLM's `KVCacheTensor` descriptor (`shared_by` on the legacy lane, `layers` + strides now)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ascend_core.upstream.probes import default_loader


def _fields(obj_or_cls: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(obj_or_cls)}


def kv_tensor_cls() -> type:
    """The installed vLLM's `KVCacheTensor` class."""
    return default_loader("vllm.v1.kv_cache_interface", "KVCacheTensor")


def kv_tensor_layers(tensor: Any) -> list[str]:
    """The layer names a descriptor stands for, whichever lane built it."""
    names = _fields(tensor)
    if "layers" in names:
        return list(tensor.layers)
    if "shared_by" in names:
        return list(tensor.shared_by)
    raise TypeError(f"{type(tensor).__name__} has neither 'layers' nor 'shared_by' (fields: {sorted(names)})")


def kv_tensor_geometry(tensor: Any) -> tuple[int, int, int]:
    """`(offset, layer_stride, block_stride)`; fields a lane lacks read as 0 (legacy aliasing: one layer per buffer)."""
    return (getattr(tensor, "offset", 0) or 0, getattr(tensor, "layer_stride", 0) or 0,
            getattr(tensor, "block_stride", 0) or 0)


def make_kv_tensor(
    size: int,
    layers: Sequence[str],
    *,
    layer_stride: int = 0,
    block_stride: int = 0,
    offset: int = 0,
    host_resident: bool = False,
    cls: type | None = None,
) -> Any:
    """Build a descriptor valid for the installed vLLM (or `cls`).

    Geometry the lane cannot express is an error rather than silently dropped: a legacy descriptor without
    `layer_stride` can only alias its layers onto one buffer, so several layers with a non-zero stride do not fit.
    """
    cls = cls or kv_tensor_cls()
    names = _fields(cls)
    kwargs: dict[str, Any] = {"size": size}
    if "layers" in names:
        kwargs["layers"] = list(layers)
    elif "shared_by" in names:
        kwargs["shared_by"] = list(layers)
    else:
        raise TypeError(f"{cls.__name__} has neither 'layers' nor 'shared_by'")
    for key, value, default in (("layer_stride", layer_stride, 0), ("block_stride", block_stride, 0),
                                ("offset", offset, 0), ("host_resident", host_resident, False)):
        if key in names:
            kwargs[key] = value
        elif value != default:
            raise ValueError(f"{cls.__name__} has no field {key!r}; cannot express {key}={value!r} on this vLLM")
    return cls(**kwargs)
