"""Allocate the KV cache with our allocator and hand it to vLLM, the one binding every layer reads.

Both runners end up here: V1 from `initialize_kv_cache_tensors`, MRV2 through the `mrv2.init_kv_cache` patch. vLLM
binds our allocator's per-layer tensors (`as_vllm_kv_caches()`, laid out in the layout the attention backends
declared) to its layers, hands each layer's tensor to its attention impl at every call and gives the same tensors to
KV connectors; no impl keeps KV memory of its own. Sleep mode frees the KV cache and wake-up allocates a new one at
other addresses (vLLM's own sleep keeps them): the KV connector drops its registrations before the release and
registers the new tensors after the re-allocation, or its transfers would touch freed memory.
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


def attention_modules_per_layer(model_config: Any) -> int:
    """How many attention modules share one decoder layer index (vLLM's `num_attn_module` for `bind_kv_cache`):
    LongCat-Flash runs two attention modules per decoder layer, every other model one."""
    return 2 if model_config.hf_config.model_type == "longcat_flash" else 1


def _check_kernel_blocks(kv_cache_config: Any, kernel_block_sizes: list[int] | None) -> None:
    for gid, group in enumerate(kv_cache_config.kv_cache_groups):
        if kernel_block_sizes and gid < len(kernel_block_sizes):
            want = group.kv_cache_spec.block_size
            if kernel_block_sizes[gid] != want:
                raise ValueError(f"Ascend attention runs whole manager blocks; group {gid} got kernel block size "
                                 f"{kernel_block_sizes[gid]} for block size {want}")


def declared_planes(kv_cache_config: Any, forward_context: Mapping[str, Any]) -> dict[str, Any]:
    """`layer -> PlaneSplit` for every layer whose attention backend declares the device KV layout its kernels take
    (`kv_cache_planes(spec)`: dense K/V or latent/rope planes); the allocator lays those layers out so."""
    from ascend_core.kv.placement import layer_specs

    out = {}
    for name, (_, spec) in layer_specs(kv_cache_config.kv_cache_groups).items():
        layer = forward_context.get(name)
        backend = layer.get_attn_backend() if hasattr(layer, "get_attn_backend") else None
        declare = getattr(backend, "kv_cache_planes", None)
        if declare is not None:
            out[name] = declare(spec)
    return out


def allocate(kv_cache_config: Any, vllm_config: Any, device: torch.device, kernel_block_sizes: list[int] | None,
             allocation_context: AbstractContextManager | None = None,
             forward_context: Mapping[str, Any] | None = None) -> Any:
    """Our allocator's `KVCacheAllocation` for `kv_cache_config`, in the layout vLLM resolved from the backends',
    each layer's pages as its backend's kernels take them (`declared_planes`)."""
    _check_kernel_blocks(kv_cache_config, kernel_block_sizes)
    mode = kv_mode_for(vllm_config)
    kv_transfer = vllm_config.kv_transfer_config is not None
    layout = resolved_kv_cache_layout(vllm_config.cache_config)
    planes = declared_planes(kv_cache_config, forward_context or {})
    with allocation_context or nullcontext():
        allocation = kv_allocator()(kv_cache_config, device=device, layout=layout, mode=mode,
                                    kv_transfer=kv_transfer, kernel_block_sizes=kernel_block_sizes, planes=planes)
    usage.count(f"allocator.{mode}")
    usage.note("allocator", f"{kv_allocator().__module__}.{kv_allocator().__name__}")
    usage.note("kv_mode", mode)
    usage.note("kv_cache_layout", getattr(layout, "name", str(layout)))
    usage.note("kv_planar_layers", len(planes))
    return allocation


def vllm_views(allocation: Any, shared_layers: Mapping[str, str]) -> dict[str, torch.Tensor]:
    views = dict(allocation.as_vllm_kv_caches())
    for layer, target in shared_layers.items():
        views[layer] = views[target]
    return views


def count_ascend_layers_on(allocation: Any, forward_context: Mapping[str, Any]) -> int:
    """After vLLM bound the KV tensors: how many Ascend attention layers will be handed our allocator's memory.

    `layer.kv_cache` is what vLLM passes the impl at each call; an Ascend layer bound to anything else (or to
    nothing) would attend over memory our allocator does not own, so it is an error here, not a wrong token later.
    """
    ours = {s.tensor.untyped_storage().data_ptr() for s in allocation.storages}
    bound = 0
    for name, layer in forward_context.items():
        if not isinstance(getattr(layer, "impl", None), AscendAttentionImpl):
            continue
        kv_cache = getattr(layer, "kv_cache", None)
        if not isinstance(kv_cache, torch.Tensor) or kv_cache.numel() == 0 or \
                kv_cache.untyped_storage().data_ptr() not in ours:
            raise RuntimeError(f"Ascend attention layer {name!r} is not bound to the Ascend allocator's KV cache "
                               f"(its kv_cache: {type(kv_cache).__name__} "
                               f"{tuple(kv_cache.shape) if isinstance(kv_cache, torch.Tensor) else ''})")
        bound += 1
    usage.count("attention.ascend.bound_layers", bound)
    usage.note("attention.ascend.bound_layers", bound)  # this engine's binding (counts add up over a process)
    return bound


def detach_layer_kv(forward_context: Mapping[str, Any]) -> None:
    """Drop every layer's reference to the KV memory about to be freed (the runner drops its own), and the
    published plane table that describes it."""
    from ascend_core.kv import planes

    planes.publish({})
    for layer in forward_context.values():
        if isinstance(getattr(layer, "kv_cache", None), torch.Tensor):
            layer.kv_cache = torch.tensor([])


def connector_release_kv() -> None:
    """Before the KV memory is freed: the KV connector, if any, drops its registrations."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    from ascend_core.upstream import unregister_connector_kv_caches

    if has_kv_transfer_group() and unregister_connector_kv_caches(get_kv_transfer_group()):
        usage.count("kv_connector.unregistered")


def connector_register_kv(kv_caches: Mapping[str, torch.Tensor]) -> None:
    """After a re-allocation: the KV connector registers the new tensors (the same call vLLM makes at start-up)."""
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if has_kv_transfer_group():
        get_kv_transfer_group().register_kv_caches(dict(kv_caches))
        usage.count("kv_connector.reregistered")
