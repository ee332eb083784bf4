"""Adapters for how a KV page is shaped and where a descriptor's pages live, whichever lane built them.

Current lane (0.29+): a spec describes its page as a logical `[H, N, C]` grid (`num_heads`, `num_states`,
`state_content_size_bytes`) and every `KVCacheTensor` of a config places its layers in ONE shared backing
(`offset + l * layer_stride + b * block_stride`). Legacy lane (<= 0.28): no such properties, and each descriptor is
its own buffer whose `shared_by` layers alias each other (one layer per cache group).
"""

from __future__ import annotations

import dataclasses
from math import prod
from typing import Any

from ascend_core.upstream.mla import mla_ratio


def _dtype_size(dtype: Any) -> int:
    return dtype.itemsize


def kv_spec_page_shape(spec: Any, kernel_block_size: int | None = None) -> tuple[int, int, int]:
    """`(H, N, C)` of one page of `spec`: head slots, stored states per (kernel) block, content bytes per cell.

    `kernel_block_size` splits a block into smaller kernel blocks (N shrinks accordingly).
    """
    block = kernel_block_size if kernel_block_size is not None else spec.block_size
    if spec.block_size % block:
        raise ValueError(f"kernel block size {block} must divide the KV block size {spec.block_size}")
    if hasattr(spec, "shapes") and hasattr(spec, "dtypes"):  # MambaSpec: one state cell per block
        content = getattr(spec, "state_content_size_bytes", None)
        if content is None:
            content = sum(prod(s) * _dtype_size(d) for s, d in zip(spec.shapes, spec.dtypes, strict=True))
        return int(getattr(spec, "num_heads", 1)), 1, int(content)
    # Legacy specs lack the grid properties; derive the same grid from the fields every release had.
    heads = getattr(spec, "num_heads", None) or spec.num_kv_heads
    if hasattr(spec, "get_num_kernel_states"):
        states = spec.get_num_kernel_states(block)
    else:
        names = {f.name for f in dataclasses.fields(spec)}
        states = block // (mla_ratio(spec) if "compress_ratio" in names else 1)
    content = getattr(spec, "state_content_size_bytes", None)
    if content is None:
        # Legacy MLA (it has `compress_ratio`) stores one latent per state; other attention packs K and V.
        names = {f.name for f in dataclasses.fields(spec)}
        head_v = 0 if "compress_ratio" in names else (getattr(spec, "head_size_v", None) or spec.head_size)
        content = (spec.head_size + head_v) * _dtype_size(spec.dtype)
    return int(heads), int(states), int(content)


def kv_tensor_shares_config_backing(tensor: Any) -> bool:
    """True when all descriptors of a config address one shared backing (current lane: they carry `layer_stride`);
    False when the descriptor is a buffer of its own whose layers alias each other (legacy `shared_by`)."""
    return "layer_stride" in {f.name for f in dataclasses.fields(tensor)}
