"""Adapters for how an attention backend declares the KV cache layout its kernels read.

Current lane (0.29+): `AttentionBackend.supported_kv_cache_layouts()` returns `KVCacheLayout` members
(`vllm.v1.kv_cache_layout`), the engine core resolves one for the model and every allocator lays the cache out in
it. Legacy lane (<= 0.28): no layout module; a backend states the logical shape and the physical order of each
layer's tensor instead (`get_kv_cache_shape` / `get_kv_cache_stride_order`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ascend_core.upstream.lane import capabilities


def kv_cache_layouts(names: Sequence[str]) -> tuple[Any, ...] | None:
    """The installed vLLM's `KVCacheLayout` members named `names` (most preferred first), or None on a release
    without standardized layouts (there the backend's shape and stride order say it)."""
    if not capabilities().has_kv_cache_layout:
        return None
    from vllm.v1.kv_cache_layout import KVCacheLayout

    unknown = [n for n in names if n not in KVCacheLayout.__members__]
    if unknown:
        raise ValueError(f"unknown KV cache layout(s) {unknown}; this vLLM has {list(KVCacheLayout.__members__)}")
    return tuple(KVCacheLayout[n] for n in names)
