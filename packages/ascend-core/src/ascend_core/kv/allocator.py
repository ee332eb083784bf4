"""Allocate the KV cache the installed vLLM's planner described, and cut the per-layer views our backends use.

`mode="shared"` follows the descriptors: one backing per config (current lane) or per descriptor (legacy lane),
groups overlaid as upstream does. `mode="private"` is for runners that cannot consume a shared backing (310P): each
layer gets its own buffer sized from its spec; plan those with `scale_budget_for_private` so the total stays
within the planner's budget. `storages` lists each real buffer once, 2 MiB aligned when a KV transfer is set up.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import torch
from vllm.logger import init_logger

from ascend_core.kv import planes as kv_planes
from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.layout import resolve_layout
from ascend_core.kv.placement import LayerPlacement, layer_specs, private_bytes, private_placements, shared_placements
from ascend_core.kv.planes import PlaneGeometry, PlaneSplit
from ascend_core.kv.views import MLAKV, AttentionKV, LayerKV, MambaState, build_layer_kv, vllm_layer_view

logger = init_logger(__name__)

KV_TRANSFER_ALIGNMENT = 2 << 20
"""Transfer engines register memory at this granularity; a registered base must sit on it."""
PRIVATE_ALIGNMENT = 512
"""Start of each private buffer inside its allocation when no transfer is set up (any dtype view fits)."""


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
    # layer -> its planes' geometry, for the layers laid out as dense planes (`ascend_core.kv.planes`)
    planar: dict[str, PlaneGeometry] = field(default_factory=dict, repr=False)

    def as_vllm_kv_caches(self) -> dict[str, torch.Tensor]:
        """`layer -> tensor` as vLLM's own `allocate_kv_cache` returns it for the same config (for the forward
        context and KV connectors): the `[B, H, N, C]` view of the layer's pages in the spec's dtype."""
        return dict(self.vllm_views)

    def zero_blocks(self, block_ids: Sequence[int], layers: Sequence[str]) -> int:
        """Zero blocks `block_ids` of `layers` through their typed views (a planar layer's block is one page per
        plane, not `tensor[block]` of the tensor vLLM binds). Hybrid models need it: vLLM hands a freed Mamba-state
        block to an attention layer, whose kernels must not read stale state bytes as keys. Returns the parts
        zeroed."""
        if not block_ids:
            return 0
        zeroed = 0
        for name in dict.fromkeys(layers):
            kv = self.layers.get(name)
            if kv is None:
                continue
            parts = kv.tensors if isinstance(kv, MambaState) else [getattr(kv, f.name) for f in fields(kv)]
            for part in parts:
                if isinstance(part, torch.Tensor):
                    idx = torch.tensor(list(block_ids), dtype=torch.long, device=part.device)
                    part.index_fill_(0, idx, 0)
                    zeroed += 1
        return zeroed

    @property
    def nbytes(self) -> int:
        """Bytes of every underlying allocation (alignment slack included), each counted once."""
        storages = {s.tensor.untyped_storage().data_ptr(): s.tensor.untyped_storage().nbytes() for s in self.storages}
        return sum(storages.values())


def _allocate(nbytes: int, device: torch.device, align: int | None) -> torch.Tensor:
    """`nbytes` zeroed bytes (as vLLM allocates them), starting on an `align` boundary when asked."""
    if not align:
        return torch.zeros(nbytes, dtype=torch.int8, device=device)
    raw = torch.zeros(nbytes + align - 1, dtype=torch.int8, device=device)
    pad = -raw.data_ptr() % align
    return raw[pad:pad + nbytes]


def _private_offsets(sizes: Sequence[int], align: int) -> tuple[list[int], int]:
    """Offsets of private buffers laid one after the other, each starting on `align`; and the total length."""
    offsets, end = [], 0
    for size in sizes:
        start = -(-end // align) * align
        offsets.append(start)
        end = start + size
    return offsets, end


def _carve_private(sizes: dict[tuple, tuple[int, torch.device]], align: int | None) -> dict[tuple, torch.Tensor]:
    """Private buffers cut from one zeroed allocation per device, each sized from its layer's spec.

    One allocation instead of one per layer: a 2 MiB base per buffer then costs at most the rounding of each
    buffer to the next boundary instead of a whole 2 MiB of slack per buffer.
    """
    out: dict[tuple, torch.Tensor] = {}
    for dev in dict.fromkeys(d for _, d in sizes.values()):
        keys = [k for k, (_, d) in sizes.items() if d == dev]
        offsets, total = _private_offsets([sizes[k][0] for k in keys], align or PRIVATE_ALIGNMENT)
        slab = _allocate(total, dev, align)
        out.update((k, slab[o:o + sizes[k][0]]) for k, o in zip(keys, offsets, strict=True))
    return out


def allocate_kv_caches(
    kv_cache_config: Any,
    *,
    device: torch.device | str,
    layout: Any = None,
    mode: Literal["shared", "private"] = "shared",
    kv_transfer: bool = False,
    kernel_block_sizes: Sequence[int] | None = None,
    host_device: torch.device | str = "cpu",
    planes: Mapping[str, PlaneSplit] | None = None,
) -> KVCacheAllocation:
    """Allocate `kv_cache_config` (from the installed vLLM's planner) on `device`.

    `layout` is the resolved `KVCacheLayout` (or its name); by default the config's, else LBHNC.
    `kernel_block_sizes[g]` splits group g's blocks into kernel blocks, as vLLM's allocator does.
    Host-resident caches (descriptor or spec flag) go to `host_device`.
    `planes[layer]` lays that layer's pages out as dense planes (the device KV layout the layer's kernel backend
    declared, `ascend_core.kv.planes`); every other layer keeps vLLM's packed cells.
    """
    if mode not in ("shared", "private"):
        raise ValueError(f"mode must be 'shared' or 'private', got {mode!r}")
    resolved = resolve_layout(layout, kv_cache_config)
    kbs = list(kernel_block_sizes) if kernel_block_sizes is not None else None
    place = shared_placements if mode == "shared" else private_placements
    placements = place(kv_cache_config, resolved, kbs) if kv_cache_config.kv_cache_tensors else []
    device, host_device = torch.device(device), torch.device(host_device)
    align = KV_TRANSFER_ALIGNMENT if kv_transfer else None

    members: dict[tuple, dict[str, None]] = {}  # backing -> its layers, in placement order
    for p in placements:
        members.setdefault(p.backing, {})[p.layer] = None
    sizes = {p.backing: (p.backing_size, host_device if p.host else device) for p in placements}
    if mode == "private":
        backings = _carve_private(sizes, align)
    else:
        backings = {key: _allocate(size, dev, align) for key, (size, dev) in sizes.items()}

    layers: dict[str, LayerKV] = {}
    vllm_views: dict[str, torch.Tensor] = {}
    planar: dict[str, PlaneGeometry] = {}
    planes = dict(planes or {})
    paged = _paged_planar_layers(placements, planes)
    _check_planar_regions(placements, {name: split for name, split in planes.items() if name not in paged})
    for p in placements:
        byte_view = _byte_view(backings[p.backing], p)
        if p.layer in planes:
            layers[p.layer], vllm_views[p.layer], planar[p.layer] = _planar(byte_view, p, planes[p.layer],
                                                                             p.layer in paged)
        else:
            layers[p.layer] = build_layer_kv(byte_view, p.spec, p.layer)
            vllm_views[p.layer] = vllm_layer_view(byte_view, p.spec)
    kv_planes.publish({name: (vllm_views[name].data_ptr(), geometry) for name, geometry in planar.items()})

    storages = [RegisteredStorage(buf.data_ptr(), buf.numel(), tuple(members[key]), buf.device, buf)
                for key, buf in backings.items()]
    logger.debug("allocated KV cache (%s, layout %s): %d layers in %d buffer(s), %d bytes", mode, resolved.name,
                 len(layers), len(storages), sum(s.nbytes for s in storages))
    return KVCacheAllocation(kv_cache_config.num_blocks, mode, layers, storages, vllm_views, planar)


def _plane_sizes(p: LayerPlacement, split: PlaneSplit) -> tuple[int, int]:
    """(bytes of every plane together, element size) of a planar layer, checked against its planned cells."""
    blocks, heads, states, content = p.shape
    size = p.spec.dtype.itemsize
    if sum(split.widths) * size != content:
        raise KVLayoutError(f"layer {p.layer!r}: planes {dict(zip(split.names, split.widths, strict=True))} of "
                            f"{p.spec.dtype} take {sum(split.widths) * size} bytes per state and head, its planned "
                            f"cells {content}")
    dense_page = heads * states * content
    if blocks > 1 and p.strides[0] < dense_page:
        raise KVLayoutError(f"layer {p.layer!r}: block stride {p.strides[0]} B is smaller than its page "
                            f"({dense_page} B), so its pages cannot be re-laid as planes")
    return blocks * dense_page, size


def _is_state(spec: Any) -> bool:
    """A Mamba-style state spec (vLLM's `MambaSpec` family: states of given shapes and dtypes, no per-token KV)."""
    return hasattr(spec, "shapes") and hasattr(spec, "dtypes")


def _paged_planar_layers(placements: Sequence[LayerPlacement], planes: Mapping[str, PlaneSplit]) -> set[str]:
    """The planar layers that get paged planes (`ascend_core.kv.planes`): those of a backing where a planar layer
    shares bytes with a Mamba-style state layer (a hybrid model's GDN / Mamba states overlaid on its attention
    pages). Paged planes touch only the layer's own pages, so such an overlay is as safe as vLLM's own (each block
    id belongs to one group). An overlay with packed attention cells stays refused (`_check_planar_regions`)."""
    by_backing: dict[tuple, list[LayerPlacement]] = {}
    for p in placements:
        by_backing.setdefault(p.backing, []).append(p)
    paged: set[str] = set()
    for members in by_backing.values():
        mixed = any(a.layer in planes and _is_state(b.spec) and a.offset < b.end and b.offset < a.end
                    for a in members for b in members)
        if mixed:
            paged.update(p.layer for p in members if p.layer in planes)
    return paged


def _check_planar_regions(placements: Sequence[LayerPlacement], planes: Mapping[str, PlaneSplit]) -> None:
    """A planar layer spreads block `b` over every plane of its region, so no layer of another geometry may share
    those bytes (vLLM overlays one layer of each KV cache group on the same pages and hands each block id to one
    group; with planes that holds only among layers of the same geometry) and its region must hold its pages only
    (layer-major layouts; block-major ones interleave other layers' pages)."""
    spans = []
    for p in placements:
        if p.layer in planes:
            nbytes, _ = _plane_sizes(p, planes[p.layer])
            key = (p.shape, p.spec.dtype, planes[p.layer])
            spans.append((p.backing, p.offset, p.offset + nbytes, key, p.layer))
        else:
            spans.append((p.backing, p.offset, p.end, None, p.layer))
    by_backing: dict[tuple, list[tuple]] = {}
    for span in spans:
        by_backing.setdefault(span[0], []).append(span)
    for members in by_backing.values():
        members.sort(key=lambda s: (s[1], s[2]))
        for i, (_, start, end, key, layer) in enumerate(members):
            for _, other_start, _other_end, other_key, other in members[i + 1:]:
                if other_start >= end:
                    break
                same_region = key is not None and other_key == key and other_start == start
                if (key is not None or other_key is not None) and not same_region:
                    raise KVLayoutError(f"layers {layer!r} and {other!r} share KV memory, and "
                                        f"{layer if key is not None else other!r} is laid out as dense planes: "
                                        "only layers of one geometry, overlaid from one start, may share planar "
                                        "memory (use a layer-major KV layout such as LBNHC)")


def _planar(byte_view: torch.Tensor, p: LayerPlacement, split: PlaneSplit, paged: bool = False
            ) -> tuple[LayerKV, torch.Tensor, PlaneGeometry]:
    blocks, heads, states, content = p.shape
    nbytes, size = _plane_sizes(p, split)
    block_stride = None
    if paged:  # each block's planes inside its own page, pages where vLLM planned them
        if p.strides[0] % size:
            raise KVLayoutError(f"layer {p.layer!r}: block stride {p.strides[0]} B is not a whole number of "
                                f"{p.spec.dtype} elements")
        block_stride, nbytes = p.strides[0] // size, p.end - p.offset
    region = torch.as_strided(byte_view, (nbytes,), (1,)).view(p.spec.dtype)
    geometry = kv_planes.plane_geometry(split, blocks, states, heads, p.spec.dtype, block_stride)
    parts = kv_planes.cut_planes(region, geometry)
    bound = kv_planes.bound_view(region, geometry, (blocks, heads, states, content // size))
    if split.names == ("latent", "rope"):
        return MLAKV(*parts), bound, geometry
    if split.names == ("key", "value"):
        return AttentionKV(*parts), bound, geometry
    raise KVLayoutError(f"layer {p.layer!r}: no KV views for planes {split.names}")


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


def private_total_bytes(kv_cache_groups_or_config: Any, num_blocks: int, *, kv_transfer: bool = False) -> int:
    """Bytes private mode allocates for `num_blocks` (per device: buffers laid end to end on their alignment)."""
    groups = getattr(kv_cache_groups_or_config, "kv_cache_groups", kv_cache_groups_or_config)
    by_host: dict[bool, list[int]] = {}
    for _, spec in layer_specs(groups).values():
        by_host.setdefault(bool(getattr(spec, "host_resident", False)), []).append(num_blocks * private_bytes(spec))
    align = KV_TRANSFER_ALIGNMENT if kv_transfer else PRIVATE_ALIGNMENT
    slack = KV_TRANSFER_ALIGNMENT - 1 if kv_transfer else 0
    return sum(_private_offsets(sizes, align)[1] + slack for sizes in by_host.values())


def scale_budget_for_private(kv_cache_groups_or_config: Any, available_memory: int, *,
                             kv_transfer: bool = False) -> int:
    """The memory to hand vLLM's planner so that private per-layer buffers never exceed `available_memory`.

    The planner sizes blocks by the widest group (groups overlay in its shared backing); private buffers pay for
    every layer of every group, plus their alignment. Finds the most blocks whose private total fits, and returns
    the shared budget that buys exactly that many (never more: vLLM's own bytes per block are at least ours).
    """
    groups = getattr(kv_cache_groups_or_config, "kv_cache_groups", kv_cache_groups_or_config)
    shared, private = shared_bytes_per_block(groups), private_bytes_per_block(groups)
    if not private:
        return available_memory
    lo, hi = 0, available_memory // private  # private_total_bytes(lo) fits; hi is an upper bound
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if private_total_bytes(groups, mid, kv_transfer=kv_transfer) <= available_memory:
            lo = mid
        else:
            hi = mid - 1
    return lo * shared
