"""A stand-in for `ascend_core.kv.allocate_kv_caches` until the KV package lands (same call shape, attention only).

Only `kv_allocator()` in `ascend_platform.facade` may return this module's function; delete it once
`ascend_core.kv` exists. Page interior: all keys of the block `[block_size, heads, head_size]`, then all values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class AttentionKV:
    key: torch.Tensor  # [num_blocks, block_size, num_kv_heads, head_size]
    value: torch.Tensor


@dataclass
class KVCacheAllocation:
    layers: dict[str, AttentionKV]
    storages: list[torch.Tensor]
    raw: dict[str, torch.Tensor] = field(default_factory=dict)
    mode: str = "shared"

    def as_vllm_kv_caches(self) -> dict[str, torch.Tensor]:
        return dict(self.raw)


def _spec_of(kv_cache_config, layer: str):
    for group in kv_cache_config.kv_cache_groups:
        if layer in group.layer_names:
            spec = group.kv_cache_spec
            return getattr(spec, "kv_cache_specs", {}).get(layer, spec)
    raise KeyError(f"layer {layer!r} is in no KV cache group")


def allocate_kv_caches(kv_cache_config, *, device, layout=None, mode="shared", kv_transfer=False,
                       kernel_block_sizes=None) -> KVCacheAllocation:
    from ascend_core.upstream import kv_tensor_geometry, kv_tensor_layers

    if mode != "shared":
        raise NotImplementedError(f"interim allocator supports mode='shared' only, got {mode!r}")
    tensors = kv_cache_config.kv_cache_tensors
    if not tensors:
        return KVCacheAllocation({}, [])
    backing = torch.zeros(tensors[0].size, dtype=torch.int8, device=device)
    out = KVCacheAllocation({}, [backing])
    num_blocks = kv_cache_config.num_blocks
    for t in tensors:
        offset, layer_stride, block_stride = kv_tensor_geometry(t)
        for i, name in enumerate(kv_tensor_layers(t)):
            spec = _spec_of(kv_cache_config, name)
            esize = torch.empty((), dtype=spec.dtype).element_size()
            bs, h, d = spec.block_size, spec.num_kv_heads, spec.head_size
            dv = getattr(spec, "head_size_v", None) or d
            start = offset + i * layer_stride
            assert start % esize == 0 and block_stride % esize == 0
            typed = backing.view(spec.dtype)
            k = typed.as_strided((num_blocks, bs, h, d), (block_stride // esize, h * d, d, 1), start // esize)
            v = typed.as_strided((num_blocks, bs, h, dv), (block_stride // esize, h * dv, dv, 1),
                                 start // esize + bs * h * d)
            out.layers[name] = AttentionKV(k, v)
            out.raw[name] = backing.as_strided((num_blocks, spec.page_size_bytes), (block_stride, 1), start)
    return out
