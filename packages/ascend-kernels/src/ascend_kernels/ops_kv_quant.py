"""int8 KV cache ops of the kernel facade (ModelSlim's C8): quantizing cache writes and attention that dequantizes.

The caches are the dense int8 `[num_blocks, block_size, num_kv_heads, head_size]` planes the allocator gives a layer
whose KV spec is int8. Scales and zero points are float32 `[num_kv_heads * head_size]` vectors (per channel, as
ModelSlim writes `kv_cache_scale` / `kv_cache_offset`) or `[1]` (per tensor); a None offset is symmetric.
"""

from __future__ import annotations

import torch

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import NpuBinding, kernel_op
from ascend_kernels.reference import kv_quant as _ref


def _int8_caches(op: str, key_cache, value_cache) -> None:
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if not isinstance(cache, torch.Tensor) or cache.dim() != 4 or cache.dtype != torch.int8:
            _v.fail(op, name, cache, "an int8 [num_blocks, block_size, num_kv_heads, head_size] cache")


def _channels(op: str, name: str, t, channels: int, dev: torch.device, *, optional: bool) -> None:
    if t is None and optional:
        return
    expected = f"a float32 [{channels}] (num_kv_heads * head_size) or [1] vector" + (" (or None)" if optional else "")
    if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.dim() != 1
            or t.shape[0] not in (1, channels)):
        _v.fail(op, name, t, expected)
    _v.same_device(op, name, t, dev, expected)


def _scales(op: str, key_cache, value_cache, key_scale, key_offset, value_scale, value_offset) -> None:
    dev = key_cache.device
    k_channels = key_cache.shape[2] * key_cache.shape[3]
    v_channels = value_cache.shape[2] * value_cache.shape[3]
    _channels(op, "key_scale", key_scale, k_channels, dev, optional=False)
    _channels(op, "key_offset", key_offset, k_channels, dev, optional=True)
    _channels(op, "value_scale", value_scale, v_channels, dev, optional=False)
    _channels(op, "value_offset", value_offset, v_channels, dev, optional=True)


def check_reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping, key_scale, key_offset,
                                  value_scale, value_offset) -> None:
    op = "reshape_and_cache_quant"
    _v.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    _v.floating(op, "key", key, "[num_tokens, num_kv_heads, head_size] float")
    _v.floating(op, "value", value, "[num_tokens, num_kv_heads, head_size_v] float")
    _int8_caches(op, key_cache, value_cache)
    _scales(op, key_cache, value_cache, key_scale, key_offset, value_scale, value_offset)


def check_paged_attention_antiquant(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, key_scale,
                                    key_offset, value_scale, value_offset, scale, sliding_window, sinks,
                                    out) -> None:
    op = "paged_attention_antiquant"
    _int8_caches(op, key_cache, value_cache)
    _v.tensor(op, "query", query, 3, "[num_tokens, num_heads, head_size]")
    _v.floating(op, "query", query, "[num_tokens, num_heads, head_size]")
    # The rest of the contract is paged_attention's over the dequantized caches (same shapes, the query's dtype):
    # checked on stand-ins of that shape that hold no memory (one element, expanded).
    as_float = torch.empty((), dtype=query.dtype, device=key_cache.device).expand(key_cache.shape)
    as_float_v = torch.empty((), dtype=query.dtype, device=value_cache.device).expand(value_cache.shape)
    _v.check_paged_attention(query, as_float, as_float_v, block_table, query_start_loc, seq_lens, scale,
                             sliding_window, sinks, out)
    _scales(op, key_cache, value_cache, key_scale, key_offset, value_scale, value_offset)


@kernel_op(validate=check_reshape_and_cache_quant, reference=_ref.reshape_and_cache_quant,
           npu=NpuBinding(target="torch_npu.npu_quantize + torch_npu._npu_reshape_and_cache", kind="torch_npu",
                          note="per-channel npu_quantize (div_mode False, float32 reciprocal scales and zero "
                               "points, qint8) of K and V, then the int8 cache write; dense caches",
                          impl="ascend_kernels.npu_kv_quant:reshape_and_cache_quant"))
def reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping, key_scale, key_offset, value_scale,
                            value_offset) -> None:
    """`reshape_and_cache` into int8 caches: each token's K and V quantized first, per channel of the flattened
    `[num_kv_heads * head_size]` (or per tensor), `q = clamp(round(x * (1 / scale) + offset), -128, 127)` with the
    float32 reciprocal, half to even; a None offset is 0. Slots as in `reshape_and_cache` (-1: no request's block).
    In place.
    """


@kernel_op(validate=check_paged_attention_antiquant, reference=_ref.paged_attention_antiquant,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score_v2 (+ npu_anti_quant)", kind="torch_npu",
                          note="decode-only batches: BNSD query over the paged int8 caches with per-channel "
                               "dequant_scale/offset_key/value (key/value_quant_mode 0); otherwise the batch's blocks "
                               "dequantized by npu_anti_quant into scratch pages for the float paged attention",
                          impl="ascend_kernels.npu_kv_quant:paged_attention_antiquant"))
def paged_attention_antiquant(
    query,
    key_cache,
    value_cache,
    block_table,
    query_start_loc,
    seq_lens,
    *,
    key_scale: torch.Tensor,
    key_offset: torch.Tensor | None = None,
    value_scale: torch.Tensor,
    value_offset: torch.Tensor | None = None,
    scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    query_start_loc_host: list[int] | None = None,
    seq_lens_host: list[int] | None = None,
) -> torch.Tensor:
    """`paged_attention` over int8 caches: every cached key and value read as `(q - offset) * scale` per channel (or
    per tensor) in the query's dtype, then attended exactly as `paged_attention` does (same arguments, masks,
    windows, sinks, padding rows and output). Only the blocks the batch's contexts span are dequantized.
    """
