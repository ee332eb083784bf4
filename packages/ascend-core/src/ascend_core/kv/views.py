"""Per-layer KV views our attention backends consume, cut from a layer's raw `[B, H, N, C]` byte view.

A page cell (one head, one stored state) holds `C` bytes. Plain attention packs K then V there (as vLLM does);
MLA packs latent, rope, then scales; the indexer packs its key then scales; Mamba packs its states one after the
other in a single cell per block; DeepSeek V4's fp8_ds_mla rows are packed cells its kernels decode themselves.
Every view here is a strided view of the same bytes, never a copy. Layers whose backend declares the device layout
are not cut from cells: the allocator lays them out as dense planes (`ascend_core.kv.planes`), and
`attention_kv_of` / `mla_kv_of` take the planes from the tensor vLLM binds to such a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

import torch

from ascend_core.kv.errors import KVLayoutError
from ascend_core.kv.specs import AscendSparseIndexerSpec, _AscendPageParts

# vLLM's MLA specs do not say where the rotary part starts; every MLA model vLLM ships keeps 64 rope dims last.
DEFAULT_MLA_ROPE_DIM = 64


@dataclass(frozen=True)
class AttentionKV:
    """K and V, each `[num_blocks, block_size, num_kv_heads, head_size]` (strided)."""

    key: torch.Tensor
    value: torch.Tensor


@dataclass(frozen=True)
class MLAKV:
    """Latent and rope parts, each `[num_blocks, storage_block_size, 1, dim]`; `scale` when the spec has scales."""

    latent: torch.Tensor
    rope: torch.Tensor
    scale: torch.Tensor | None = None


@dataclass(frozen=True)
class IndexerKV:
    """The sparse indexer's keys `[num_blocks, storage_block_size, heads, head_size]` and their scales."""

    k: torch.Tensor
    scale: torch.Tensor | None


@dataclass(frozen=True)
class MambaState:
    """Mamba state tensors, each `[num_blocks, *state_shape]`."""

    tensors: tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class PackedKV:
    """Cells `[num_blocks, block_size, 1, C]` (uint8) in a packed quantised format only the layer's own kernels
    decode: DeepSeek V4's fp8_ds_mla rows (448 fp8 NoPE bytes, 64 bf16 rope values, 8 UE8M0 scale bytes)."""

    cells: torch.Tensor


LayerKV = AttentionKV | MLAKV | IndexerKV | MambaState | PackedKV


def _dtype_size(dtype: torch.dtype) -> int:
    return dtype.itemsize


def _part(byte_view: torch.Tensor, start: int, nbytes: int, dtype: torch.dtype, layer: str) -> torch.Tensor:
    """Bytes `[start, start + nbytes)` of every cell, as `dtype`, axes `[B, N, H, elements]`."""
    try:
        typed = byte_view[..., start:start + nbytes].view(dtype)
    except RuntimeError as exc:
        raise KVLayoutError(f"layer {layer!r}: bytes [{start}, {start + nbytes}) of its page cells cannot be viewed "
                            f"as {dtype} (offset or strides not a multiple of {_dtype_size(dtype)}): {exc}") from exc
    return typed.permute(0, 2, 1, 3)


def _mamba_states(byte_view: torch.Tensor, spec: Any, layer: str) -> MambaState:
    pages = byte_view.flatten(1, 2)[:, 0, :]  # H = N = 1 for Mamba: [B, C]
    states, offset = [], 0
    for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True):
        nbytes = prod(shape) * _dtype_size(dtype)
        try:
            state = pages[:, offset:offset + nbytes].view(dtype)
        except RuntimeError as exc:
            raise KVLayoutError(f"layer {layer!r}: Mamba state at byte {offset} cannot be viewed as {dtype}") from exc
        states.append(state.unflatten(1, tuple(shape)))
        offset += nbytes
    return MambaState(tuple(states))


def build_layer_kv(byte_view: torch.Tensor, spec: Any, layer: str) -> LayerKV:
    """The typed views of one layer from its `[B, H, N, C]` int8 view, by the kind of its spec."""
    if hasattr(spec, "shapes") and hasattr(spec, "dtypes"):
        return _mamba_states(byte_view, spec, layer)
    dtype = getattr(spec, "dtype", None)
    if dtype is None:
        raise KVLayoutError(f"layer {layer!r}: no per-layer views for spec {type(spec).__name__}")
    size = _dtype_size(dtype)
    content = byte_view.shape[-1]
    if isinstance(spec, _AscendPageParts):
        head_bytes = spec.head_size * size
        scale = (_part(byte_view, head_bytes, spec.scale_bytes, spec.scale_dtype, layer)
                 if spec.scale_dim else None)
        if isinstance(spec, AscendSparseIndexerSpec):
            return IndexerKV(_part(byte_view, 0, head_bytes, dtype, layer), scale)
        rope_bytes = spec.rope_head_dim * size
        return MLAKV(_part(byte_view, 0, head_bytes - rope_bytes, dtype, layer),
                     _part(byte_view, head_bytes - rope_bytes, rope_bytes, dtype, layer), scale)
    if getattr(spec, "state_content_bytes", None) is not None and size == 1:
        return PackedKV(_part(byte_view, 0, content, torch.uint8, layer))
    if getattr(spec, "state_content_bytes", None) is not None or content % size:
        raise KVLayoutError(f"layer {layer!r}: {type(spec).__name__} packs {content}-byte cells in a quantised "
                            f"format; no K/V views for it")
    # K then V per cell; V's width is whatever the cell holds past K (0 for MLA, whose latent has no V).
    head_v = content // size - spec.head_size
    if head_v == 0:  # vLLM's own MLA spec: one latent per state, rope last
        rope = DEFAULT_MLA_ROPE_DIM if spec.head_size > DEFAULT_MLA_ROPE_DIM else 0
        latent_bytes = (spec.head_size - rope) * size
        return MLAKV(_part(byte_view, 0, latent_bytes, dtype, layer),
                     _part(byte_view, latent_bytes, rope * size, dtype, layer))
    key_bytes = spec.head_size * size
    return AttentionKV(_part(byte_view, 0, key_bytes, dtype, layer),
                       _part(byte_view, key_bytes, head_v * size, dtype, layer))


def attention_kv_of(kv_cache: torch.Tensor, head_size: int) -> AttentionKV:
    """The K and V views of the KV tensor vLLM hands a standard attention layer.

    Our allocator binds planar layers (`ascend_core.kv.planes`) as `[2, num_blocks, block_size, num_kv_heads,
    head_size]`: K and V are each one dense cache, what torch_npu's kernels take. A packed tensor
    (`[num_blocks, num_kv_heads, block_size, C]`, any stride order: each state holds `head_size` key elements, then
    the value) is cut into strided K and V views, as `build_layer_kv` cuts them."""
    if kv_cache.dim() == 5:
        if kv_cache.shape[0] != 2 or kv_cache.shape[-1] != head_size:
            raise KVLayoutError(f"planar attention KV tensor of shape {tuple(kv_cache.shape)}: expected "
                                f"[2, num_blocks, block_size, num_kv_heads, {head_size}]")
        return AttentionKV(kv_cache[0], kv_cache[1])
    if kv_cache.dim() != 4 or not 0 < head_size < kv_cache.shape[-1]:
        raise KVLayoutError(f"attention KV tensor of shape {tuple(kv_cache.shape)} cannot hold a key of {head_size} "
                            f"elements and a value per state ([num_blocks, num_kv_heads, block_size, C] expected)")
    return AttentionKV(kv_cache[..., :head_size].permute(0, 2, 1, 3), kv_cache[..., head_size:].permute(0, 2, 1, 3))


def mla_kv_of(kv_cache: torch.Tensor, kv_lora_rank: int) -> MLAKV:
    """The latent and rope caches in the planar KV tensor our allocator binds to an MLA layer.

    The tensor (`[num_blocks, block_size, C]`, or the allocator's `[num_blocks, 1, block_size, C]`, dense) is the
    layer's region: the latent plane (`num_blocks * block_size * kv_lora_rank` elements), then the rope plane, each
    one dense `[num_blocks, block_size, 1, dim]` cache (`ascend_core.kv.planes`), what torch_npu's MLA kernels take."""
    if kv_cache.dim() == 4:
        if kv_cache.shape[1] != 1:
            raise KVLayoutError(f"an MLA KV tensor has one head, got shape {tuple(kv_cache.shape)}")
        kv_cache = kv_cache[:, 0]
    if kv_cache.dim() != 3 or not 0 < kv_lora_rank < kv_cache.shape[-1]:
        raise KVLayoutError(f"MLA KV tensor of shape {tuple(kv_cache.shape)} cannot hold a latent of "
                            f"{kv_lora_rank} elements and a rope part per state")
    if not kv_cache.is_contiguous():
        raise KVLayoutError(f"MLA KV tensor of shape {tuple(kv_cache.shape)} and strides {kv_cache.stride()} is not "
                            f"the dense planar region the Ascend allocator binds")
    blocks, block_size, cell = kv_cache.shape
    latent_elems = blocks * block_size * kv_lora_rank
    flat = kv_cache.reshape(-1)
    latent = flat[:latent_elems].view(blocks, block_size, 1, kv_lora_rank)
    rope = flat[latent_elems:].view(blocks, block_size, 1, cell - kv_lora_rank)
    return MLAKV(latent, rope)


def vllm_layer_view(byte_view: torch.Tensor, spec: Any) -> torch.Tensor:
    """What vLLM's own allocator hands the forward context for this layer: the `[B, H, N, C]` view in the
    spec's dtype (raw int8 for specs without one, e.g. Mamba)."""
    dtype = getattr(spec, "dtype", None)
    return byte_view.view(dtype) if dtype is not None else byte_view
