"""Allocate the KV cache the installed vLLM's planner described, and cut the per-layer views our backends use.

`mode="shared"` follows the descriptors: one backing per config (current lane) or per descriptor (legacy lane),
groups overlaid as upstream does. `mode="private"` is for runners that cannot consume a shared backing (310P): each
layer gets its own buffer sized from its spec; plan those with `scale_budget_for_private` so the total stays
within the planner's budget. `storages` lists each real buffer once, 2 MiB aligned when a KV transfer is set up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from vllm.logger import init_logger

from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.layout import resolve_layout
from ascend_core.kv.placement import LayerPlacement, layer_specs, private_bytes, private_placements, shared_placements
from ascend_core.kv.views import LayerKV, build_layer_kv, vllm_layer_view

logger = init_logger(__name__)

KV_TRANSFER_ALIGNMENT = 2 << 20
"""Transfer engines register memory at this granularity; a registered base must sit on it."""


@dataclass(frozen=True)
class RegisteredStorage:
    """One real buffer for a transfer engine to register: base address, length, and the layers inside it."""

    data_ptr: int
    nbytes: int
    layers: tuple[str, ...]
    device: torch.device
    tensor: torch.Tensor = field(repr=False, compare=False)


@dataclass
class KVCacheAllocation:
    """The allocated KV cache: typed per-layer views, the real storages, and vLLM's own per-layer views."""

    num_blocks: int
    mode: str
    layers: dict[str, LayerKV]
    storages: list[RegisteredStorage]
    vllm_views: dict[str, torch.Tensor] = field(repr=False)

    def as_vllm_kv_caches(self) -> dict[str, torch.Tensor]:
        """`layer -> tensor` as vLLM's own `allocate_kv_cache` returns it for the same config (for the forward
        context and KV connectors): the `[B, H, N, C]` view of the layer's pages in the spec's dtype."""
        return dict(self.vllm_views)

    @property
    def nbytes(self) -> int:
        """Bytes of every real buffer (alignment slack included)."""
        return sum(s.tensor.untyped_storage().nbytes() for s in self.storages)


def _allocate(nbytes: int, device: torch.device, align: int | None) -> torch.Tensor:
    """`nbytes` zeroed bytes (as vLLM allocates them), starting on an `align` boundary when asked."""
    if not align:
        return torch.zeros(nbytes, dtype=torch.int8, device=device)
    raw = torch.zeros(nbytes + align - 1, dtype=torch.int8, device=device)
    pad = -raw.data_ptr() % align
    return raw[pad:pad + nbytes]


def allocate_kv_caches(
    kv_cache_config: Any,
    *,
    device: torch.device | str,
    layout: Any = None,
    mode: Literal["shared", "private"] = "shared",
    kv_transfer: bool = False,
    kernel_block_sizes: Sequence[int] | None = None,
    host_device: torch.device | str = "cpu",
) -> KVCacheAllocation:
    """Allocate `kv_cache_config` (from the installed vLLM's planner) on `device`.

    `layout` is the resolved `KVCacheLayout` (or its name); by default the config's, else LBHNC.
    `kernel_block_sizes[g]` splits group g's blocks into kernel blocks, as vLLM's allocator does.
    Host-resident caches (descriptor or spec flag) go to `host_device`.
    """
    if mode not in ("shared", "private"):
        raise ValueError(f"mode must be 'shared' or 'private', got {mode!r}")
    resolved = resolve_layout(layout, kv_cache_config)
    kbs = list(kernel_block_sizes) if kernel_block_sizes is not None else None
    place = shared_placements if mode == "shared" else private_placements
    placements = place(kv_cache_config, resolved, kbs) if kv_cache_config.kv_cache_tensors else []
    device, host_device = torch.device(device), torch.device(host_device)
    align = KV_TRANSFER_ALIGNMENT if kv_transfer else None

    backings: dict[tuple, torch.Tensor] = {}
    members: dict[tuple, list[str]] = {}
    for p in placements:
        if p.backing not in backings:
            backings[p.backing] = _allocate(p.backing_size, host_device if p.host else device, align)
            members[p.backing] = []
        if p.layer not in members[p.backing]:
            members[p.backing].append(p.layer)

    layers: dict[str, LayerKV] = {}
    vllm_views: dict[str, torch.Tensor] = {}
    for p in placements:
        byte_view = _byte_view(backings[p.backing], p)
        layers[p.layer] = build_layer_kv(byte_view, p.spec, p.layer)
        vllm_views[p.layer] = vllm_layer_view(byte_view, p.spec)

    storages = [RegisteredStorage(buf.data_ptr(), buf.numel(), tuple(members[key]), buf.device, buf)
                for key, buf in backings.items()]
    logger.debug("allocated KV cache (%s, layout %s): %d layers in %d buffer(s), %d bytes", mode, resolved.name,
                 len(layers), len(storages), sum(s.nbytes for s in storages))
    return KVCacheAllocation(kv_cache_config.num_blocks, mode, layers, storages, vllm_views)


def _byte_view(backing: torch.Tensor, p: LayerPlacement) -> torch.Tensor:
    if p.end > backing.numel():
        raise KVLayoutError(f"layer {p.layer!r}: view ends at byte {p.end}, past the end of its backing "
                            f"({backing.numel()} bytes)")
    return torch.as_strided(backing, p.shape, p.strides, backing.storage_offset() + p.offset)


def private_bytes_per_block(kv_cache_groups_or_config: Any) -> int:
    """Bytes one block costs when every layer of every group has a private buffer."""
    groups = getattr(kv_cache_groups_or_config, "kv_cache_groups", kv_cache_groups_or_config)
    return sum(private_bytes(spec) for _, spec in layer_specs(groups).values())


def shared_bytes_per_block(kv_cache_groups_or_config: Any) -> int:
    """Bytes one block costs in a shared backing whose groups overlay (the widest group), before alignment."""
    groups = getattr(kv_cache_groups_or_config, "kv_cache_groups", kv_cache_groups_or_config)
    specs = layer_specs(groups)
    widths = [sum(private_bytes(specs[name][1]) for name in g.layer_names) for g in groups]
    return max(widths, default=0)


def scale_budget_for_private(kv_cache_groups_or_config: Any, available_memory: int, *,
                             kv_transfer: bool = False) -> int:
    """The memory to hand vLLM's planner so that private per-layer buffers never exceed `available_memory`.

    The planner sizes blocks by the widest group (groups overlay in its shared backing); private buffers pay for
    every layer of every group, plus alignment slack per buffer when a KV transfer needs 2 MiB bases.
    """
    groups = getattr(kv_cache_groups_or_config, "kv_cache_groups", kv_cache_groups_or_config)
    shared, private = shared_bytes_per_block(groups), private_bytes_per_block(groups)
    if not private:
        return available_memory
    slack = (KV_TRANSFER_ALIGNMENT - 1) * len(layer_specs(groups)) if kv_transfer else 0
    blocks = max(available_memory - slack, 0) // private
    return blocks * shared
