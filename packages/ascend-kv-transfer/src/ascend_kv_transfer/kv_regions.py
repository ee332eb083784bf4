"""Byte geometry of the KV caches vLLM hands a connector: per-layer regions and the memory to register.

vLLM passes `register_kv_caches` one view per layer; on current releases all of them are strided views into one
backing buffer. What a transfer engine registers is the memory the views cover: the byte extents of the views,
merged where they touch or overlap (registering the same memory twice fails or double-counts). Not the whole
allocation behind them: an allocator may pad its buffers to align them (the Ascend allocator starts each KV buffer
on a 2 MiB boundary, which the device transports require of a registered base), and the padding is not KV.
A layer's block must be one dense page (a gap-free byte range, in any internal order), or, for a layer the Ascend
allocator laid out as dense planes (`ascend_core.kv.planes`: K and V, or MLA's latent and rope, each one dense
cache), one dense page per plane, each plane a region of its own (`layer#part`); no two layers of one KV cache group
may overlap; anything else is rejected with the layer's name. Layers of different groups may share memory:
vLLM's hybrid allocator backs one layer of each group with the same tensor and hands each block id to one group at a
time (DeepSeek V4's compressor states live in the pages of its compressed caches' blocks), so a block id's bytes
belong to whichever group owns it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ascend_core.kv.planes import planes_of
from ascend_kv_transfer.p2p.schema import LayerRegion


class KVLayoutError(ValueError):
    """The KV cache layout cannot be moved as whole pages (non-contiguous or overlapping)."""


@dataclass(frozen=True)
class Storage:
    """One span of memory to register: the merged extents of the KV views inside one allocation."""

    addr: int
    nbytes: int


@dataclass(frozen=True)
class KVRegions:
    regions: list[LayerRegion]
    storages: list[Storage]

    @property
    def bytes_per_block(self) -> int:
        return sum(r.page_bytes for r in self.regions)


def connector_layers(kv_caches: Mapping[str, torch.Tensor],
                     layer_groups: Mapping[str, int]) -> dict[str, torch.Tensor]:
    """The tensors of `register_kv_caches` that a connector's KV cache groups cover (`layer_groups`), every one."""
    ours = {name: t for name, t in kv_caches.items() if name in layer_groups}
    missing = sorted(set(layer_groups) - set(ours))
    if missing:
        raise ValueError(f"register_kv_caches got no tensor for layers {missing[:4]} of the KV cache config")
    return ours


def describe_kv_caches(kv_caches: Mapping[str, torch.Tensor], num_blocks: int | None = None,
                       groups: Mapping[str, int] | None = None) -> KVRegions:
    """Regions (one per layer, in the dict's order) and the memory spans to register for `kv_caches`.

    `num_blocks` is the scheduler's block count; when a tensor holds a multiple of it (kernel blocks smaller than
    the manager's block), a manager block spans that many kernel pages, which must then be back to back.
    `groups` maps a layer to its KV cache group (default 0).
    """
    regions: list[LayerRegion] = []
    extents: dict[int, list[tuple[int, int]]] = {}  # allocation -> (start, end) of each view inside it
    for name, tensor in kv_caches.items():
        planes = planes_of(name, tensor)
        parts = [(name, tensor)] if planes is None else [(f"{name}#{part}", plane) for part, plane in planes]
        group = (groups or {}).get(name, 0)
        for region_name, view in parts:
            extents.setdefault(view.untyped_storage().data_ptr(), []).append(_extent(region_name, view))
            regions.append(_region(region_name, name, view, num_blocks, group))
    by_group: dict[int, list[LayerRegion]] = {}
    for region in regions:
        by_group.setdefault(region.group, []).append(region)
    for members in by_group.values():
        _check_no_overlap(members)
    return KVRegions(regions, [s for spans in extents.values() for s in _merge(spans)])


def _region(name: str, layer: str, tensor: torch.Tensor, num_blocks: int | None, group: int) -> LayerRegion:
    if tensor.dim() < 2:
        raise KVLayoutError(f"layer {name!r}: expected a [blocks, ...] view, got shape {tuple(tensor.shape)}")
    kernel_blocks = tensor.shape[0]
    ratio = 1
    if num_blocks:
        if kernel_blocks % num_blocks:
            raise KVLayoutError(f"layer {name!r}: {kernel_blocks} kernel blocks is not a multiple of "
                                f"{num_blocks} blocks")
        ratio = kernel_blocks // num_blocks
    page = tensor[0]
    if not _dense(page):
        raise KVLayoutError(f"layer {name!r}: a block's page is not one dense range of bytes (shape "
                            f"{tuple(tensor.shape)}, strides {tensor.stride()}); use a block-major layer layout "
                            "such as LBHNC")
    kernel_page = page.nbytes
    kernel_stride = tensor.stride(0) * tensor.element_size()
    if kernel_stride < kernel_page:
        raise KVLayoutError(f"layer {name!r}: block stride {kernel_stride} B is smaller than its page "
                            f"{kernel_page} B (pages overlap)")
    if ratio > 1 and kernel_stride != kernel_page:
        raise KVLayoutError(f"layer {name!r}: {ratio} kernel blocks per block but kernel pages are not back to "
                            f"back (stride {kernel_stride} B, page {kernel_page} B)")
    return LayerRegion(name=name, base_addr=tensor.data_ptr(), block_stride=kernel_stride * ratio,
                       page_bytes=kernel_page * ratio, num_blocks=kernel_blocks // ratio, group=group, layer=layer)


def _dense(page: torch.Tensor) -> bool:
    """The page fills one gap-free byte range, in whatever order its dimensions are laid out (e.g. LBNHC stores a
    block's tokens outside its heads): such a page moves as one piece, and both sides agree on the layout."""
    dims = sorted((stride, size) for size, stride in zip(page.shape, page.stride(), strict=True) if size > 1)
    expected = 1
    for stride, size in dims:
        if stride != expected:
            return False
        expected *= size
    return True


def _extent(name: str, tensor: torch.Tensor) -> tuple[int, int]:
    """First and one-past-last byte a view can touch."""
    if any(s < 0 for s in tensor.stride()):
        raise KVLayoutError(f"layer {name!r}: negative strides {tensor.stride()}")
    last = sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True)) if tensor.numel() else -1
    return tensor.data_ptr(), tensor.data_ptr() + (last + 1) * tensor.element_size()


def _merge(spans: list[tuple[int, int]]) -> list[Storage]:
    """Spans that touch or overlap become one (layers of one buffer, back to back, register as the buffer)."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [Storage(start, end - start) for start, end in merged if end > start]


def _check_no_overlap(regions: list[LayerRegion]) -> None:
    """Two layers whose pages interleave would be copied over each other: reject them by name.

    Pages of one layer are spaced `block_stride` apart; another layer may live in the gaps (block-major layouts) but
    never inside a page. Two layers of equal stride whose extents meet collide exactly when their pages do within one
    stride period (page offsets taken modulo the stride); a dense layer (stride = page) is no exception.
    """
    by_stride: dict[int, list[LayerRegion]] = {}
    for r in regions:
        by_stride.setdefault(r.block_stride, []).append(r)
    for stride, group in by_stride.items():
        spans = sorted((r.base_addr, r.base_addr + (r.num_blocks - 1) * stride + r.page_bytes, r) for r in group
                       if r.num_blocks > 0)
        for i, (s0, e0, r0) in enumerate(spans):
            for s1, _e1, r1 in spans[i + 1:]:
                if s1 >= e0:
                    break  # sorted by start: no later layer reaches into this one's extent
                apart = (s1 - s0) % stride
                if apart < r0.page_bytes or stride - apart < r1.page_bytes:
                    raise KVLayoutError(f"layers {r0.name!r} and {r1.name!r} overlap ({s1 - s0} B apart, page "
                                        f"{r0.page_bytes} B, stride {stride} B)")
