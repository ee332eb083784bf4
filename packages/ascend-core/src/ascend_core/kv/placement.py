"""Where every layer's pages live: a `KVCacheConfig` checked and turned into per-layer byte placements.

Shared placements follow the descriptors exactly (current lane: one backing per config, page of `layers[l]` for
block `b` at `offset + l*layer_stride + b*block_stride`, groups overlaid from byte 0; legacy lane: one buffer per
descriptor whose `shared_by` layers alias it). Private placements give each layer a buffer of its own, sized from
its spec. Every inconsistency is an error naming the descriptor or layer and the values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.layout import DIM_B, DIM_L, KVLayout, layout_strides, span_bytes
from ascend_core.upstream import kv_tensor_geometry, kv_tensor_layers
from ascend_core.upstream.kv_page import kv_spec_page_shape, kv_tensor_shares_config_backing


@dataclass(frozen=True)
class LayerPlacement:
    """One layer's `[B, H, N, C]` byte view: which backing, where block 0 starts, shape and byte strides."""

    layer: str
    group_id: int
    spec: Any
    backing: tuple
    backing_size: int
    host: bool
    offset: int
    shape: tuple[int, int, int, int]
    strides: tuple[int, int, int, int]
    end: int
    """One past the last byte the view touches."""


def layer_specs(kv_cache_groups: Any) -> dict[str, tuple[int, Any]]:
    """`layer -> (group id, the layer's own spec)`; a layer in two groups is an error."""
    out: dict[str, tuple[int, Any]] = {}
    for gid, group in enumerate(kv_cache_groups):
        group_spec = group.kv_cache_spec
        per_layer = getattr(group_spec, "kv_cache_specs", None)  # UniformTypeKVCacheSpecs
        for name in group.layer_names:
            if name in out:
                raise KVLayoutError(f"layer {name!r} is in cache groups {out[name][0]} and {gid}")
            out[name] = (gid, per_layer[name] if per_layer is not None else group_spec)
    return out


def _check_coverage(kv_cache_config: Any, specs: dict[str, tuple[int, Any]]) -> None:
    seen: dict[str, int] = {}
    for i, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        for name in kv_tensor_layers(tensor):
            if name not in specs:
                raise KVLayoutError(f"KV cache tensor #{i} names layer {name!r}, which no cache group holds")
            if name in seen:
                raise KVLayoutError(f"layer {name!r} (cache group {specs[name][0]}) is in two KV cache tensors of "
                                    f"one group: #{seen[name]} and #{i}")
            seen[name] = i
    missing = [n for n in specs if n not in seen]
    if missing:
        raise KVLayoutError(f"layer {missing[0]!r} (cache group {specs[missing[0]][0]}) is covered by no KV cache "
                            f"tensor ({len(missing)} uncovered layer(s): {missing[:8]})")


def _check_sizes(kv_cache_config: Any) -> None:
    sizes: dict[bool, dict[int, list[int]]] = {}
    for i, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        if kv_tensor_shares_config_backing(tensor):
            host = bool(getattr(tensor, "host_resident", False))
            sizes.setdefault(host, {}).setdefault(tensor.size, []).append(i)
    for host, by_size in sizes.items():
        if len(by_size) > 1:
            detail = "; ".join(f"size {s}: tensors {idx}" for s, idx in sorted(by_size.items()))
            raise KVLayoutError(f"KV cache tensors sharing one {'host' if host else 'device'} backing have unequal "
                                f"sizes ({detail})")


def _kernel_split(spec: Any, group_id: int, kernel_block_sizes: list[int] | None) -> int | None:
    if kernel_block_sizes is None or group_id >= len(kernel_block_sizes):
        return None
    kb = kernel_block_sizes[group_id]
    return None if kb == spec.block_size else kb


def _check_strides(where: str, layout: KVLayout, shape5: tuple[int, ...], strides5: tuple[int, ...],
                   page: int) -> None:
    """Pages of a block-compact layout are contiguous runs; their L/B grid must not fold onto itself."""
    if not layout.is_block_compact:
        return
    outer, inner = (DIM_L, DIM_B) if layout.order[0] == DIM_L else (DIM_B, DIM_L)
    names = {DIM_L: "layer_stride", DIM_B: "block_stride"}
    if shape5[inner] > 1 and strides5[inner] < page:
        raise KVLayoutError(f"{where}: {names[inner]}={strides5[inner]} is smaller than a page ({page} bytes)")
    if shape5[outer] > 1 and strides5[outer] < page:
        raise KVLayoutError(f"{where}: {names[outer]}={strides5[outer]} is smaller than a page ({page} bytes)")
    reach = strides5[inner] * (shape5[inner] - 1) + page
    if shape5[outer] > 1 and strides5[outer] < reach:
        raise KVLayoutError(f"{where}: {names[outer]}={strides5[outer]} is smaller than the {reach} bytes its "
                            f"{shape5[inner]} {names[inner].split('_')[0]} pages span, so pages overlap")


def _page_geometry(spec: Any, kb: int | None) -> tuple[int, int, int, int | None]:
    heads, states, content = kv_spec_page_shape(spec, kb)
    padded = getattr(spec, "page_size_padded", None)
    return heads, states, content, padded


def _descriptor_grid(where: str, spec: Any, kb: int | None, layout: KVLayout, n_layers: int, num_blocks: int,
                     layer_stride: int, block_stride: int) -> tuple[tuple[int, ...], tuple[int, ...], int]:
    """`[L, B, H, N, C]` shape, byte strides and view span of a descriptor's layers of one spec, checked."""
    heads, states, content, padded = _page_geometry(spec, kb)
    dense_page = heads * kv_spec_page_shape(spec)[1] * content
    page = max(dense_page, padded or 0)
    blocks = num_blocks
    if kb is not None:
        split = spec.block_size // kb
        if block_stride != dense_page:
            raise KVLayoutError(f"{where}: block_stride={block_stride} is not one dense page ({dense_page} bytes),"
                                f" so a block cannot be split into {split} kernel blocks of {kb} tokens")
        blocks, block_stride, padded, page = num_blocks * split, block_stride // split, None, dense_page // split
    shape5 = (n_layers, blocks, heads, states, content)
    strides5 = layout_strides(shape5, layout, padded_page=padded,
                              fixed=(layer_stride or None, block_stride or None, None, None, None))
    _check_strides(where, layout, shape5, strides5, page)
    return shape5, strides5, span_bytes(shape5[1:], strides5[1:])


def shared_placements(kv_cache_config: Any, layout: KVLayout,
                      kernel_block_sizes: list[int] | None = None) -> list[LayerPlacement]:
    """Placements exactly as the config's descriptors say, validated."""
    specs = layer_specs(kv_cache_config.kv_cache_groups)
    _check_coverage(kv_cache_config, specs)
    _check_sizes(kv_cache_config)
    out: list[LayerPlacement] = []
    for i, tensor in enumerate(kv_cache_config.kv_cache_tensors):
        names = kv_tensor_layers(tensor)
        offset, layer_stride, block_stride = kv_tensor_geometry(tensor)
        host = bool(getattr(tensor, "host_resident", False))
        shares = kv_tensor_shares_config_backing(tensor)
        num_blocks = kv_cache_config.num_blocks
        if host and getattr(kv_cache_config, "hisparse_host_num_blocks", None):
            num_blocks = kv_cache_config.hisparse_host_num_blocks
        backing = ("config", host) if shares else ("tensor", i)
        # Legacy descriptors alias their layers: every layer sees the whole buffer from the same offset.
        n_layers = len(names) if shares else 1
        grids: dict[tuple, tuple] = {}  # one descriptor's layers share a spec: compute its grid once
        for index, name in enumerate(names):
            gid, spec = specs[name]
            kb = _kernel_split(spec, gid, kernel_block_sizes)
            where = f"KV cache tensor #{i}, layer {name!r}"
            if (spec, kb) not in grids:
                grids[spec, kb] = _descriptor_grid(where, spec, kb, layout, n_layers, num_blocks, layer_stride,
                                                   block_stride)
            shape5, strides5, span = grids[spec, kb]
            start = offset + (index if shares else 0) * strides5[DIM_L]
            if start + span > tensor.size:
                raise KVLayoutError(f"{where}: its view ends at byte {start + span}, past the end of its backing "
                                    f"({tensor.size} bytes; offset={offset}, layer_stride={strides5[DIM_L]}, "
                                    f"block_stride={strides5[DIM_B]}, num_blocks={shape5[DIM_B]})")
            out.append(LayerPlacement(name, gid, spec, backing, tensor.size, host, start, shape5[1:], strides5[1:],
                                      start + span))
    return out


def private_placements(kv_cache_config: Any, layout: KVLayout,
                       kernel_block_sizes: list[int] | None = None) -> list[LayerPlacement]:
    """One buffer per layer, sized from the layer's own spec (never from a descriptor's `size`)."""
    specs = layer_specs(kv_cache_config.kv_cache_groups)
    out: list[LayerPlacement] = []
    for name, (gid, spec) in specs.items():
        kb = _kernel_split(spec, gid, kernel_block_sizes)
        heads, states, content, padded = _page_geometry(spec, kb)
        blocks = kv_cache_config.num_blocks * (spec.block_size // kb if kb else 1)
        shape5 = (1, blocks, heads, states, content)
        strides5 = layout_strides(shape5, layout, padded_page=None if kb else padded)
        size = max(strides5[d] * shape5[d] for d in range(5))
        host = bool(getattr(spec, "host_resident", False))
        out.append(LayerPlacement(name, gid, spec, ("layer", name), size, host, 0, shape5[1:], strides5[1:],
                                  span_bytes(shape5[1:], strides5[1:])))
    return out


def private_bytes(spec: Any) -> int:
    """Bytes per block a private per-layer buffer of `spec` takes."""
    heads, states, content = kv_spec_page_shape(spec)
    return max(heads * states * content, getattr(spec, "page_size_padded", None) or 0)
