"""NPU bindings of the int8 KV cache ops (`ascend_kernels.ops_kv_quant`), over torch_npu 2.13.0's kernels:

    npu_quantize(Tensor input, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True)
    _npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache,
                           Tensor slot_indices)
    npu_fused_infer_attention_score_v2(..., Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None,
                                       Tensor? dequant_scale_value=None, Tensor? dequant_offset_value=None, ...,
                                       int key_quant_mode=0, int value_quant_mode=0, ...)
    npu_anti_quant(Tensor x, Tensor scale, *, Tensor? offset=None, int? dst_dtype=None, int? src_dtype=None)

Writes quantize K and V per channel with `npu_quantize` (multiply mode: float32 reciprocal scales and zero points,
vllm-ascend's C8 convention) and store the int8 rows with the ATB cache write. Reads: FIA dequantizes int8 paged
caches itself only in its incremental branch (every query one token; its docs: page attention takes no antiquant
when a query is longer, and TND takes none), so a decode-only batch runs FIA with a BNSD query and per-channel
`(x + offset) * scale` dequant parameters in the query's dtype; any other batch (prefill rows, a sliding window or
sinks, a block size off FIA's int8 granularity of 32) has the blocks its contexts span dequantized by
`npu_anti_quant` into scratch pages and runs the float paged attention binding over them. torch_npu is reached
through `npu_backend._npu()` (counted per call); what no kernel takes runs the reference, recorded in `npu_usage`.
"""

from __future__ import annotations

import torch

from ascend_kernels import npu_backend, npu_usage
from ascend_kernels.npu_backend import _npu
from ascend_kernels.reference import kv_quant as _ref

_QINT8 = 12
_DTYPE_ENUM = {torch.float16: 5, torch.bfloat16: 15}
_INT8_BLOCK_GRANULARITY = 32  # FIA's page attention over int8 caches: block_size a multiple of 32


def _channels(t: torch.Tensor | None, channels: int) -> torch.Tensor | None:
    """A `[1]` (per tensor) or `[channels]` vector as `[channels]` float32 (the kernels' per-channel form)."""
    if t is None:
        return None
    return t.float().expand(channels).contiguous() if t.numel() == 1 else t.float()


def _quantize(x: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None) -> torch.Tensor:
    t, h, d = x.shape
    recip = 1.0 / _channels(scale, h * d)
    zero = _channels(offset, h * d)
    return _npu().npu_quantize(x.reshape(t, h * d), recip, zero, _QINT8, -1, False).view(t, h, d)


def reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping, key_scale, key_offset, value_scale,
                            value_offset):
    reason = None
    if not npu_backend._dense(key_cache, value_cache):
        reason = npu_backend._not_dense("reshape_and_cache_quant", key_cache, value_cache)
    elif key.dtype not in (torch.float32, *_DTYPE_ENUM):
        reason = f"key dtype {key.dtype}: npu_quantize takes float32 / float16 / bfloat16"
    if reason is not None:
        npu_usage.record_fallback("reshape_and_cache_quant", reason)
        return _ref.reshape_and_cache_quant(key, value, key_cache, value_cache, slot_mapping, key_scale, key_offset,
                                            value_scale, value_offset)
    _npu()._npu_reshape_and_cache(_quantize(key, key_scale, key_offset), _quantize(value, value_scale, value_offset),
                                  key_cache, value_cache, npu_backend._kernel_slots(slot_mapping))


def _dequant_params(scale, offset, cache: torch.Tensor, dtype: torch.dtype):
    """FIA's per-channel dequant scale and offset for a [blocks, block_size, heads, dim] cache: `(1, heads, 1, dim)`
    in the query's dtype, the offset negated (FIA adds it: `(x + offset) * scale`)."""
    heads, dim = cache.shape[2], cache.shape[3]
    shape = (1, heads, 1, dim)
    s = _channels(scale, heads * dim).to(dtype).view(shape)
    o = None if offset is None else (-_channels(offset, heads * dim)).to(dtype).view(shape)
    return s, o


def _anti_quant(pages: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor | None,
                dtype: torch.dtype) -> torch.Tensor:
    n, bs, heads, dim = pages.shape
    s = _channels(scale, heads * dim)
    o = None if offset is None else -_channels(offset, heads * dim)
    flat = _npu().npu_anti_quant(pages.view(n, bs, heads * dim), s, offset=o, dst_dtype=_DTYPE_ENUM[dtype])
    return flat.view(n, bs, heads, dim)


def paged_attention_antiquant(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, key_scale,
                              key_offset=None, value_scale, value_offset=None, scale, causal=True,
                              sliding_window=None, sinks=None, out=None, query_start_loc_host=None,
                              seq_lens_host=None):
    reason = None
    if not npu_backend._dense(key_cache, value_cache):
        reason = npu_backend._not_dense("paged_attention_antiquant", key_cache, value_cache)
    elif query.dtype not in _DTYPE_ENUM:
        reason = f"query dtype {query.dtype}: FIA and npu_anti_quant compute float16 / bfloat16"
    if reason is not None:
        npu_usage.record_fallback("paged_attention_antiquant", reason)
        return _ref.paged_attention_antiquant(
            query, key_cache, value_cache, block_table, query_start_loc, seq_lens, key_scale=key_scale,
            key_offset=key_offset, value_scale=value_scale, value_offset=value_offset, scale=scale, causal=causal,
            sliding_window=sliding_window, sinks=sinks, out=out, query_start_loc_host=query_start_loc_host,
            seq_lens_host=seq_lens_host)
    # Lengths at launch: the caller's host lists (built once per step), else one read-back each.
    starts = npu_backend._host(query_start_loc_host, query_start_loc)
    lens = npu_backend._host(seq_lens_host, seq_lens)
    if not starts[-1]:  # only padding rows: nothing to launch
        return npu_backend._copy_rows(None, 0, query.shape[0], query.shape[1], value_cache.shape[3], out, query)
    decode_only = all(b - a == 1 for a, b in zip(starts, starts[1:], strict=False)) and len(lens) == starts[-1]
    if not (decode_only and sliding_window is None and sinks is None and key_cache.shape[3] == value_cache.shape[3]
            and key_cache.shape[1] % _INT8_BLOCK_GRANULARITY == 0):
        ids, table = _ref.referenced_blocks(block_table, lens, key_cache.shape[1])
        keys = _anti_quant(key_cache.index_select(0, ids), key_scale, key_offset, query.dtype)
        values = _anti_quant(value_cache.index_select(0, ids), value_scale, value_offset, query.dtype)
        return npu_backend.paged_attention(query, keys, values, table, query_start_loc, seq_lens, scale=scale,
                                           causal=causal, sliding_window=sliding_window, sinks=sinks, out=out,
                                           query_start_loc_host=starts, seq_lens_host=lens)
    # Every request one query token: FIA's incremental branch dequantizes the int8 pages itself.
    b, h, d = len(lens), query.shape[1], query.shape[2]
    ks, ko = _dequant_params(key_scale, key_offset, key_cache, query.dtype)
    vs, vo = _dequant_params(value_scale, value_offset, value_cache, query.dtype)
    if (ko is None) != (vo is None):  # FIA takes both offsets or neither: the missing one is 0
        ko = torch.zeros_like(ks) if ko is None else ko
        vo = torch.zeros_like(vs) if vo is None else vo
    result, _ = _npu().npu_fused_infer_attention_score_v2(
        query[:b].contiguous().view(b, h, 1, d), npu_backend._flat_blocks(key_cache),
        npu_backend._flat_blocks(value_cache), num_query_heads=h, num_key_value_heads=key_cache.shape[2],
        input_layout="BNSD", softmax_scale=scale, block_table=block_table.to(torch.int32),
        block_size=key_cache.shape[1], actual_seq_kvlen=lens, dequant_scale_key=ks, dequant_offset_key=ko,
        dequant_scale_value=vs, dequant_offset_value=vo, key_quant_mode=0, value_quant_mode=0)
    return npu_backend._copy_rows(result, b, query.shape[0], h, value_cache.shape[3], out, query)
