"""Allocate the KV cache with our allocator and bind it into vLLM's layers and our attention impls.

Both runners end up here: V1 from `initialize_kv_cache_tensors`, MRV2 through the `mrv2.init_kv_cache` patch. vLLM's
layers get the raw per-layer tensors (`as_vllm_kv_caches()`, what KV connectors register); our attention impls get
the typed key/value views. Sleep mode frees the KV cache and wake-up allocates a new one at other addresses (vLLM's
own sleep keeps them): the KV connector drops its registrations before the release and registers the new tensors
after the re-allocation, or its transfers would touch freed memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from vllm.logger import init_logger

from ascend_core.upstream import resolved_kv_cache_layout
from ascend_platform import usage
from ascend_platform.attention.backend import AscendAttentionImpl
from ascend_platform.facade import kv_allocator

logger = init_logger(__name__)


def kv_mode_for(vllm_config: Any) -> str:
    from ascend_platform.npu_platform import ascend_config_of
    from ascend_platform.platform import NPUPlatform

    ascend = ascend_config_of(vllm_config)
    if ascend.kv_cache_mode != "auto":
        return ascend.kv_cache_mode
    return "private" if NPUPlatform.chip(ascend) == "310P" else "shared"


def _check_kernel_blocks(kv_cache_config: Any, kernel_block_sizes: list[int] | None) -> None:
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        if kernel_block_sizes and gid < len(kernel_block_sizes):
            want = group.kv_cache_spec.block_size
            if kernel_block_sizes[gid] != want:
                raise ValueError(f"Ascend attention runs whole manager blocks; group {gid} got kernel block size "
                                 f"{kernel_block_sizes[gid]} for block size {want}")


def allocate(kv_cache_config: Any, vllm_config: Any, device: torch.device, kernel_block_sizes: list[int] | None,
             allocation_context: AbstractContextManager | None = None) -> Any:
    """Our allocator's `KVCacheAllocation` for `kv_cache_config`."""
    _check_kernel_blocks(kv_cache_config, kernel_block_sizes)
    mode = kv_mode_for(vllm_config)
    kv_transfer = vllm_config.kv_transfer_config is not None
    with allocation_context or nullcontext():
        allocation = kv_allocator()(kv_cache_config, device=device,
                                    layout=resolved_kv_cache_layout(vllm_config.cache_config),
                                    mode=mode, kv_transfer=kv_transfer, kernel_block_sizes=kernel_block_sizes)
    usage.count(f"allocator.{mode}")
    usage.note("allocator", f"{kv_allocator().__module__}.{kv_allocator().__name__}")
    usage.note("kv_mode", mode)
    return allocation


def vllm_views(allocation: Any, shared_layers: Mapping[str, str]) -> dict[str, torch.Tensor]:
    views = dict(allocation.as_vllm_kv_caches())
    for layer, target in shared_layers.items():
        views[layer] = views[target]
    return views


def bind_ascend_impls(allocation: Any, forward_context: Mapping[str, Any], shared_layers: Mapping[str, str]) -> int:
    """Hand each Ascend attention impl its key/value views; returns how many impls were bound."""
    bound = 0
    for name, layer in forward_context.items():
        impl = getattr(layer, "impl", None)
        if not isinstance(impl, AscendAttentionImpl):
            continue
        source = shared_layers.get(name, name)
        if source not in allocation.layers:
            raise KeyError(f"Ascend attention layer {name!r} has no KV cache in the allocation "
                           f"(allocated: {sorted(allocation.layers)[:8]}...)")
        impl.bind_ascend_kv(allocation.layers[source])
        bound += 1
    usage.count("attention.ascend.bound_layers", bound)
    usage.note("attention.ascend.bound_layers", bound)  # this engine's binding (counts add up over a process)
    return bound


def unbind_ascend_impls(forward_context: Mapping[str, Any]) -> None:
    for layer in forward_context.values():
        impl = getattr(layer, "impl", None)
        if isinstance(impl, AscendAttentionImpl):
            impl.bind_ascend_kv(None)
        if hasattr(layer, "kv_cache") and isinstance(layer.kv_cache, torch.Tensor):
            layer.kv_cache = torch.tensor([])


def connector_release_kv() -> None:
    """Before the KV memory is freed: the KV connector drops its registrations (vLLM 0.33's sleep hook
    `unregister_kv_caches`; a connector without it, e.g. on an older vLLM, has nothing to drop here)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if has_kv_transfer_group():
        unregister = getattr(get_kv_transfer_group(), "unregister_kv_caches", None)
        if unregister is not None:
            unregister()


def connector_register_kv(kv_caches: Mapping[str, torch.Tensor]) -> None:
    """After a re-allocation: the KV connector registers the new tensors (the same call vLLM makes at start-up)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if has_kv_transfer_group():
        get_kv_transfer_group().register_kv_caches(dict(kv_caches))
        usage.count("kv_connector.reregistered")
