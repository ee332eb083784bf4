"""The device KV layout: a layer's pages stored as dense planes, one per part of its state cell.

torch_npu's paged kernels take dense caches only (its docs: paged key/value caches "do not support non-contiguous
tensors"): K and V each one contiguous `[num_blocks, block_size, num_kv_heads, head_size]` tensor, and MLA's latent
and rope each one contiguous `[num_blocks, block_size, 1, dim]` tensor, as vllm-ascend allocates them. vLLM plans a
layer's pages as cells that pack the parts (K then V; latent then rope), so the layer's bytes are laid out here as
planes instead: the layer's region (the `num_blocks` pages vLLM planned for it, back to back) holds plane 0 for every
block, then plane 1 for every block, and so on. The byte count per layer and the block count are vLLM's.

Block `b` of a planar layer is then not one byte range but one range per plane (`plane_base + b * plane_page`), so
code that moves pages (KV connectors) asks `planes_of` how a layer's tensor splits; a layer that is not planar here
(e.g. on plain vLLM) is one page per block, as before. The table below is the latest allocation's, published by the
allocator and holding no memory (addresses and shapes only, so freeing the KV cache frees it).

A layer that shares its bytes with a layer of another kind (a hybrid model: vLLM overlays a Mamba-state group on
the attention group and hands each block id to one group) cannot spread block `b` over the whole region, as its
planes would run over blocks the other group owns. Its planes are then paged: block `b`'s page (at the block stride
vLLM planned) holds plane 0's page for `b`, then plane 1's, each dense `[block_size, heads, width]`, so every plane is
a `[num_blocks, block_size, heads, width]` tensor whose blocks sit one block stride apart (upstream lays attention
out the same way beside Mamba layers) and the layer touches only the bytes of its own pages.

The planes are the kernel backend's declaration (`ascend_kernels.op_registry.kv_layout(backend)`, principle 9): the
plane names and their order come from it, and a backend declaring a layout these dense planes cannot give is an
error here rather than caches its kernels would refuse.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from ascend_core.kv.errors import KVLayoutError


@dataclass(frozen=True)
class PlaneSplit:
    """How a layer's state cell splits into planes: each part's name and width in elements (per state and head)."""

    names: tuple[str, ...]
    widths: tuple[int, ...]

    def __post_init__(self):
        if len(self.names) != len(self.widths) or not self.names or min(self.widths) <= 0:
            raise ValueError(f"a plane split needs one positive width per part, got {self.names} {self.widths}")


@dataclass(frozen=True)
class PlaneGeometry:
    """One planar layer: plane `i` is the `shapes[i]` tensor at element `offsets[i]` of the region, contiguous, or
    (paged planes, `block_stride` set) with its blocks `block_stride` elements apart."""

    split: PlaneSplit
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    dtype: torch.dtype
    block_stride: int | None = None

    @property
    def elements(self) -> int:
        if self.block_stride is None:
            return self.offsets[-1] + _numel(self.shapes[-1])
        return (self.shapes[0][0] - 1) * self.block_stride + self.offsets[-1] + _numel(self.shapes[-1][1:])

    def strides(self, i: int) -> tuple[int, ...]:
        _, block_size, heads, width = self.shapes[i]
        block = self.block_stride if self.block_stride is not None else block_size * heads * width
        return (block, heads * width, width, 1)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def plane_geometry(split: PlaneSplit, num_blocks: int, block_size: int, num_heads: int,
                   dtype: torch.dtype, block_stride: int | None = None) -> PlaneGeometry:
    """Dense planes one after the other, or with `block_stride` (elements) paged planes: each block's pages of
    every plane one after the other inside that block's page."""
    shapes, offsets, at = [], [], 0
    for width in split.widths:
        shape = (num_blocks, block_size, num_heads, width)
        shapes.append(shape)
        offsets.append(at)
        at += _numel(shape) if block_stride is None else _numel(shape[1:])
    if block_stride is not None and at > block_stride:
        raise KVLayoutError(f"paged planes {split.names} take {at} elements per block, more than the block stride "
                            f"({block_stride})")
    return PlaneGeometry(split, tuple(shapes), tuple(offsets), dtype, block_stride)


def cut_planes(region: torch.Tensor, geometry: PlaneGeometry) -> tuple[torch.Tensor, ...]:
    """The planes of a layer from any tensor whose first element is the region's first (same storage)."""
    if region.dtype != geometry.dtype:
        raise KVLayoutError(f"planes of dtype {geometry.dtype} cut from a {region.dtype} tensor")
    flat = region.as_strided((geometry.elements,), (1,))
    if geometry.block_stride is None:
        return tuple(flat[o:o + _numel(s)].view(s) for s, o in zip(geometry.shapes, geometry.offsets, strict=True))
    return tuple(flat[o:].as_strided(s, geometry.strides(i))
                 for i, (s, o) in enumerate(zip(geometry.shapes, geometry.offsets, strict=True)))


def bound_view(region: torch.Tensor, geometry: PlaneGeometry, cell_view_shape: tuple[int, ...]) -> torch.Tensor:
    """The one tensor vLLM binds to a planar layer: planes of equal width stacked (`[planes, num_blocks,
    block_size, heads, width]`, vLLM's own K/V-first shape); otherwise the region as the dense cell-shaped tensor
    vLLM's layer expects (`cell_view_shape`), whose contents are the planes (see `planes_of`)."""
    flat = region.as_strided((geometry.elements,), (1,))
    widths = set(geometry.split.widths)
    if geometry.block_stride is not None:
        if len(widths) != 1:
            raise KVLayoutError(f"paged planes {geometry.split.names} of unequal widths have no one bound view")
        plane_page = geometry.offsets[1] - geometry.offsets[0] if len(geometry.offsets) > 1 else 0
        return flat.as_strided((len(geometry.shapes), *geometry.shapes[0]), (plane_page, *geometry.strides(0)))
    if len(widths) == 1:
        return flat.view(len(geometry.shapes), *geometry.shapes[0])
    return flat.view(cell_view_shape)


class _Table:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.layers: dict[str, tuple[int, PlaneGeometry]] = {}


_TABLE = _Table()


def publish(layers: dict[str, tuple[int, PlaneGeometry]]) -> None:
    """Record the latest allocation's planar layers (`layer -> (region address, geometry)`), replacing the last."""
    with _TABLE.lock:
        _TABLE.layers = dict(layers)


def planes_of(layer: str, tensor: torch.Tensor) -> tuple[tuple[str, torch.Tensor], ...] | None:
    """`((part name, plane tensor), ...)` when `tensor` is the planar KV of `layer` in this process's latest
    allocation, None when the layer is not planar here. A layer that shares another's KV (vLLM's KV sharing binds
    the target's tensor to it) is found by the tensor's address. A tensor at another address than the one published
    for the layer (a stale table, a copy) is an error: moving its pages as one range per block would move wrong
    bytes."""
    with _TABLE.lock:
        entry = _TABLE.layers.get(layer)
        if entry is None:
            # A KV-sharing layer is bound its target's very tensor (same dtype); a hybrid's state layer overlaid
            # on a planar layer's pages starts at the same address too, but as raw bytes of its own.
            entry = next((e for e in _TABLE.layers.values()
                          if e[0] == tensor.data_ptr() and e[1].dtype == tensor.dtype), None)
    if entry is None:
        return None
    address, geometry = entry
    if tensor.data_ptr() != address or tensor.numel() < geometry.elements:
        raise KVLayoutError(f"layer {layer!r}: its KV tensor (address {tensor.data_ptr():#x}, {tensor.numel()} "
                            f"elements) is not the planar region the allocator published (address {address:#x}, "
                            f"{geometry.elements} elements)")
    return tuple(zip(geometry.split.names, cut_planes(tensor, geometry), strict=True))


# The plane shape `plane_geometry` builds: what a backend's declared planes must be to be cut from a layer's region.
_PLANE_DIMS = ("num_blocks", "block_size")


def declared_planes(kind: str, backend: str | None = None) -> tuple[str, ...]:
    """The plane names `backend`'s kernels take for `kind` ("attention" or "mla"), in order (default: the selected
    kernel backend), from its declared KV layout."""
    from ascend_kernels import get_backend
    from ascend_kernels.op_registry import kv_layout

    name = backend if backend is not None else get_backend()
    layout = kv_layout(name)
    planes = layout.planes(kind)
    bad = {plane: dims for plane, dims in planes.items() if dims[:2] != _PLANE_DIMS or len(dims) != 4}
    if not layout.contiguous or bad or len(planes) != 2:
        raise KVLayoutError(f"kernel backend {name!r} declares {kind} planes {planes} (contiguous="
                            f"{layout.contiguous}); the allocator gives two dense [num_blocks, block_size, heads, "
                            "dim] planes")
    return tuple(planes)


def attention_planes(spec, backend: str | None = None) -> PlaneSplit:
    """K then V planes of a standard attention spec (per state `head_size` key elements, then the value), named as
    the kernel backend declares them."""
    from ascend_core.upstream.kv_page import kv_spec_page_shape

    _, _, content = kv_spec_page_shape(spec)
    elements = content // spec.dtype.itemsize
    if content % spec.dtype.itemsize or elements <= spec.head_size:
        raise KVLayoutError(f"{type(spec).__name__}: cells of {content} bytes of {spec.dtype} hold no key of "
                            f"{spec.head_size} elements and a value")
    return PlaneSplit(declared_planes("attention", backend), (spec.head_size, elements - spec.head_size))


def mla_planes(spec, rope_dim: int, backend: str | None = None) -> PlaneSplit:
    """Latent then rope planes of an MLA spec (per state `head_size` elements, the last `rope_dim` of them rope),
    named as the kernel backend declares them."""
    scale_dim = getattr(spec, "scale_dim", 0)
    if scale_dim or not 0 < rope_dim < spec.head_size:
        raise KVLayoutError(f"{type(spec).__name__}: head_size={spec.head_size}, rope_dim={rope_dim}, "
                            f"scale_dim={scale_dim}: no latent/rope planes")
    return PlaneSplit(declared_planes("mla", backend), (spec.head_size - rope_dim, rope_dim))
