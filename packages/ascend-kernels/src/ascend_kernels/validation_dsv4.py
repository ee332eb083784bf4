"""Argument checks of the DeepSeek V4 ops (`ascend_kernels.ops_dsv4`): rank, shape, dtype and device only, as
`ascend_kernels.validation`."""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import QUANT_BLOCK, ROPE_DIM, ds_mla_record_bytes
from ascend_kernels.validation import fail, floating, index, number, same_device, tensor


def _count(op: str, name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(op, name, value, f"an int >= {minimum}")


def _float_tensor(op: str, name: str, t: object, ndim: int, dims: str, dev) -> None:
    tensor(op, name, t, ndim, dims)
    floating(op, name, t, dims)
    if dev is not None:
        same_device(op, name, t, dev, dims)


def _rows(op: str, name: str, t: object, ndim: int, dims: str, dev, rows: int | None = None,
          at_least: bool = False) -> None:
    index(op, name, t, ndim, dims)
    same_device(op, name, t, dev, dims)
    if rows is not None and (t.shape[0] < rows if at_least else t.shape[0] != rows):
        fail(op, name, t, f"{dims} of dtype int32 or int64 ({'>= ' if at_least else ''}{rows} rows)")


def _cos_sin(op: str, name: str, t: object, rope_dim: int | None, dev) -> None:
    dims = f"[max_position, {rope_dim if rope_dim is not None else 'rope_dim'}] ([cos | sin] halves)"
    _float_tensor(op, name, t, 2, dims, dev)
    if t.shape[1] % 2 or (rope_dim is not None and t.shape[1] != rope_dim):
        fail(op, name, t, dims)


def _byte_cache(op: str, name: str, t: object, block_size: int, record_bytes: int, dev) -> None:
    need = block_size * record_bytes
    dims = f"a uint8 [num_blocks, >= {need}] view ({block_size} records of {record_bytes} bytes per block)"
    tensor(op, name, t, 2, dims)
    if t.dtype != torch.uint8 or t.shape[1] < need or t.stride(1) != 1:
        fail(op, name, t, dims)
    same_device(op, name, t, dev, dims)


def _record_cache(op: str, name: str, t: object, block_size: int, record_bytes: int, head_dim: int, dev) -> None:
    """An fp8_ds_mla byte cache, or (DeepSeek V4.1) plain rows of a float dtype seen as `[num_blocks, >= block_size *
    head_dim]`."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        dims = f"a float [num_blocks, >= {block_size * head_dim}] view ({block_size} rows of {head_dim} per block)"
        if t.dim() != 2 or t.shape[1] < block_size * head_dim or t.stride(1) != 1:
            fail(op, name, t, dims)
        same_device(op, name, t, dev, dims)
        return
    _byte_cache(op, name, t, block_size, record_bytes, dev)


def _ds_mla_head_dim(op: str, name: str, t: torch.Tensor) -> int:
    d = t.shape[-1]
    if d <= ROPE_DIM or (d - ROPE_DIM) % QUANT_BLOCK:
        fail(op, name, t, f"a last dim of {ROPE_DIM} rope dims plus a multiple of {QUANT_BLOCK} nope dims")
    return d - ROPE_DIM


def check_qnorm_rope_kv_insert(q, kv, positions, cache, slot_mapping, cos_sin_cache, q_head_padded, eps,
                               block_size) -> None:
    op = "dsv4_qnorm_rope_kv_insert"
    _float_tensor(op, "q", q, 3, "[num_tokens, num_heads, head_dim]", None)
    t, h, d = q.shape
    dev = q.device
    nope = _ds_mla_head_dim(op, "q", q)
    _float_tensor(op, "kv", kv, 2, f"[>= num_insert, {d}]", dev)
    if kv.shape[1] != d:
        fail(op, "kv", kv, f"[>= num_insert, {d}]")
    _rows(op, "positions", positions, 1, f"[{t}]", dev, t)
    _rows(op, "slot_mapping", slot_mapping, 1, f"[num_insert <= {min(t, kv.shape[0])}]", dev)
    if slot_mapping.shape[0] > min(t, kv.shape[0]):
        fail(op, "slot_mapping", slot_mapping, f"[num_insert <= {min(t, kv.shape[0])}] (one kv row and position each)")
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, ROPE_DIM, dev)
    _count(op, "q_head_padded", q_head_padded, minimum=h)
    number(op, "eps", eps, "a positive real number", positive=True)
    _count(op, "cache_block_size", block_size)
    _byte_cache(op, "swa_kv_cache_2d", cache, block_size, sum(ds_mla_record_bytes(nope)), dev)


def check_save_partial_states(kv, score, ape, positions, state_cache, slot_mapping) -> None:
    op = "dsv4_save_partial_states"
    _float_tensor(op, "kv", kv, 2, "[num_tokens, state_width]", None)
    t, w = kv.shape
    dev = kv.device
    _float_tensor(op, "score", score, 2, f"[{t}, {w}]", dev)
    if score.shape != kv.shape:
        fail(op, "score", score, f"[{t}, {w}]")
    _float_tensor(op, "ape", ape, 2, f"[compress_ratio, {w}]", dev)
    if ape.shape[1] != w or ape.shape[0] < 1:
        fail(op, "ape", ape, f"[compress_ratio, {w}]")
    _rows(op, "positions", positions, 1, f"[{t}]", dev, t)
    _rows(op, "slot_mapping", slot_mapping, 1, f"[{t}]", dev, t)
    _float_tensor(op, "state_cache", state_cache, 3, f"[num_blocks, block_size, {2 * w}]", dev)
    if state_cache.shape[2] != 2 * w:
        fail(op, "state_cache", state_cache, f"[num_blocks, block_size, {2 * w}] (kv then score per slot)")


def check_compress_norm_rope_store(op, state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                   rms_norm_eps, cos_sin_cache, kv_cache_2d, block_size, compress_ratio,
                                   *, indexer: bool) -> None:
    _float_tensor(op, "state_cache", state_cache, 3, "[num_blocks, block_size, 2 * state_width]", None)
    dev = state_cache.device
    _rows(op, "gather_slots", gather_slots, 2, "[num_tokens, window]", dev)
    t, window = gather_slots.shape
    _rows(op, "positions", positions, 1, f"[{t}]", dev, t)
    _rows(op, "kv_slot_mapping", kv_slot_mapping, 1, f"[{t}]", dev, t)
    _float_tensor(op, "rms_norm_weight", rms_norm_weight, 1, "[head_dim]", dev)
    d = rms_norm_weight.shape[0]
    number(op, "rms_norm_eps", rms_norm_eps, "a positive real number", positive=True)
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, None if indexer else ROPE_DIM, dev)
    rope = cos_sin_cache.shape[1]
    width = state_cache.shape[2] // 2
    if state_cache.shape[2] % 2 or width not in (d, 2 * d):
        fail(op, "state_cache", state_cache, f"[num_blocks, block_size, {2 * d} or {4 * d}] (head_dim {d})")
    _count(op, "compress_ratio", compress_ratio)
    if window > (compress_ratio if width == d else 2 * compress_ratio):
        fail(op, "gather_slots", gather_slots, f"[{t}, <= {compress_ratio if width == d else 2 * compress_ratio}]")
    _count(op, "kv_cache_block_size", block_size)
    if indexer:
        if d <= rope:
            fail(op, "rms_norm_weight", rms_norm_weight, f"[head_dim > {rope}] (rope_dim {rope})")
        record = d + 4
    else:
        if d <= rope or (d - rope) % QUANT_BLOCK:
            fail(op, "rms_norm_weight", rms_norm_weight, f"[{rope} + a multiple of {QUANT_BLOCK}]")
        record = sum(ds_mla_record_bytes(d - rope))
    _byte_cache(op, "kv_cache_2d", kv_cache_2d, block_size, record, dev)


def check_indexer_q_rope_quant(positions, index_q, cos_sin_cache, index_q_fp8, index_weights, softmax_scale,
                               head_scale, index_weights_out) -> None:
    op = "dsv4_indexer_q_rope_quant"
    _float_tensor(op, "index_q", index_q, 3, "[num_tokens, index_heads, head_dim]", None)
    t, h, d = index_q.shape
    dev = index_q.device
    _rows(op, "positions", positions, 1, f"[num_tokens <= {t}]", dev)
    if positions.shape[0] > t:
        fail(op, "positions", positions, f"[num_tokens <= {t}] (one per index_q row processed)")
    _cos_sin(op, "index_q_cos_sin_cache", cos_sin_cache, None, dev)
    if cos_sin_cache.shape[1] > d:
        fail(op, "index_q_cos_sin_cache", cos_sin_cache, f"[max_position, rope_dim <= {d}]")
    _float_tensor(op, "index_q_fp8", index_q_fp8, 3, f"[{t}, {h}, {d}]", dev)
    if index_q_fp8.shape != index_q.shape:
        fail(op, "index_q_fp8", index_q_fp8, f"[{t}, {h}, {d}]")
    for name, w in (("index_weights", index_weights), ("index_weights_out", index_weights_out)):
        _float_tensor(op, name, w, 2, f"[{t}, {h}]", dev)
        if w.shape != (t, h):
            fail(op, name, w, f"[{t}, {h}]")
    number(op, "index_weights_softmax_scale", softmax_scale, "a real number")
    number(op, "index_weights_head_scale", head_scale, "a real number")


def check_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, block_size, max_seq_len) -> None:
    op = "dsv4_fp8_paged_mqa_logits"
    _float_tensor(op, "q_fp8", q_fp8, 3, "[batch, index_heads, head_dim]", None)
    b, h, d = q_fp8.shape
    dev = q_fp8.device
    _float_tensor(op, "weight", weight, 2, f"[{b}, {h}]", dev)
    if weight.shape != (b, h):
        fail(op, "weight", weight, f"[{b}, {h}]")
    _rows(op, "seq_lens", seq_lens, 1, f"[{b}]", dev, b)
    _rows(op, "page_table", page_table, 2, f"[{b}, pages]", dev, b)
    _count(op, "block_size", block_size)
    _count(op, "max_seq_len", max_seq_len, minimum=0)
    _byte_cache(op, "kvcache_fp8", kvcache_fp8, block_size, d + 4, dev)


def check_topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices) -> None:
    op = "dsv4_topk_transform"
    _float_tensor(op, "scores", scores, 2, "[batch, max_seq_len]", None)
    b = scores.shape[0]
    dev = scores.device
    _rows(op, "seq_lens", seq_lens, 1, f"[{b}]", dev, b)
    _rows(op, "page_tables", page_tables, 2, f"[{b}, pages]", dev, b)
    _rows(op, "out_page_indices", out_page_indices, 2, f"[{b}, topk]", dev, b)
    if out_page_indices.shape[1] < 1:
        fail(op, "out_page_indices", out_page_indices, f"[{b}, topk >= 1]")
    if out_raw_indices is not None:
        _rows(op, "out_raw_indices", out_raw_indices, 2, f"{list(out_page_indices.shape)}", dev, b)
        if out_raw_indices.shape != out_page_indices.shape:
            fail(op, "out_raw_indices", out_raw_indices, f"{list(out_page_indices.shape)} of dtype int32 or int64")
    _count(op, "page_size", page_size)


def check_sparse_mla_with_kvcache(out, q, window_cache_2d, window_slots, window_block_size, compressed_cache_2d,
                                  compressed_slots, compressed_block_size, attn_sink, scale) -> None:
    op = "dsv4_sparse_mla_with_kvcache"
    _float_tensor(op, "q", q, 3, "[num_tokens, num_heads, head_dim]", None)
    t, h, d = q.shape
    dev = q.device
    nope = _ds_mla_head_dim(op, "q", q)
    _float_tensor(op, "out", out, 3, f"[{t}, {h}, {d}]", dev)
    if out.shape != q.shape:
        fail(op, "out", out, f"[{t}, {h}, {d}]")
    _rows(op, "window_slots", window_slots, 2, f"[{t}, num_window]", dev, t)
    if window_slots.shape[1] < 1:
        fail(op, "window_slots", window_slots, f"[{t}, num_window >= 1]")
    _rows(op, "compressed_slots", compressed_slots, 2, f"[{t}, num_compressed]", dev, t)
    record = sum(ds_mla_record_bytes(nope))
    _count(op, "window_block_size", window_block_size)
    _record_cache(op, "window_cache_2d", window_cache_2d, window_block_size, record, d, dev)
    if compressed_slots.shape[1]:
        _count(op, "compressed_block_size", compressed_block_size)
        _record_cache(op, "compressed_cache_2d", compressed_cache_2d, compressed_block_size, record, d, dev)
    _float_tensor(op, "attn_sink", attn_sink, 1, f"[{h}]", dev)
    if attn_sink.shape[0] != h:
        fail(op, "attn_sink", attn_sink, f"[{h}]")
    number(op, "scale", scale, "a positive real number", positive=True)


def check_inverse_rope_o_proj(o, positions, cos_sin_cache, rope_dim) -> None:
    op = "dsv4_inverse_rope_o_proj"
    _float_tensor(op, "o", o, 3, "[num_tokens, num_heads, head_dim]", None)
    t, _, d = o.shape
    _rows(op, "positions", positions, 1, f"[{t}]", o.device, t)
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 0 or rope_dim % 2 or rope_dim > d:
        fail(op, "rope_dim", rope_dim, f"an even int in [0, {d}]")
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, rope_dim if rope_dim else None, o.device)


def _streams(op: str, name: str, t: object) -> tuple[int, int]:
    dims = "[..., hc, hidden]"
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        fail(op, name, t, dims)
    floating(op, name, t, dims)
    return t.shape[-2], t.shape[-1]


def _vector(op: str, name: str, t: object, length: int, dev) -> None:
    _float_tensor(op, name, t, 1, f"[{length}]", dev)
    if t.shape[0] != length:
        fail(op, name, t, f"[{length}]")


def check_mhc_pre(residual, fn, hc_scale, hc_base, sinkhorn_repeat) -> None:
    op = "dsv4_mhc_pre"
    hc, hidden = _streams(op, "residual", residual)
    mix = (2 + hc) * hc
    _float_tensor(op, "fn", fn, 2, f"[{mix}, {hc * hidden}]", residual.device)
    if fn.shape != (mix, hc * hidden):
        fail(op, "fn", fn, f"[{mix}, {hc * hidden}]")
    _vector(op, "hc_scale", hc_scale, 3, residual.device)
    _vector(op, "hc_base", hc_base, mix, residual.device)
    _count(op, "sinkhorn_repeat", sinkhorn_repeat)


def check_mhc_post(x, residual, post_layer_mix, comb_res_mix) -> None:
    op = "dsv4_mhc_post"
    hc, hidden = _streams(op, "residual", residual)
    outer = tuple(residual.shape[:-2])
    for name, t, shape in (("x", x, (*outer, hidden)), ("post_layer_mix", post_layer_mix, (*outer, hc, 1)),
                           ("comb_res_mix", comb_res_mix, (*outer, hc, hc))):
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            fail(op, name, t, f"{list(shape)}")
        floating(op, name, t, f"{list(shape)}")
        same_device(op, name, t, residual.device, f"{list(shape)}")


def check_hc_head(hidden_states, hc_fn, hc_scale, hc_base) -> None:
    op = "dsv4_hc_head"
    hc, hidden = _streams(op, "hidden_states", hidden_states)
    _float_tensor(op, "hc_fn", hc_fn, 2, f"[{hc}, {hc * hidden}]", hidden_states.device)
    if hc_fn.shape != (hc, hc * hidden):
        fail(op, "hc_fn", hc_fn, f"[{hc}, {hc * hidden}]")
    _vector(op, "hc_scale", hc_scale, 1, hidden_states.device)
    _vector(op, "hc_base", hc_base, hc, hidden_states.device)


# The ops' own argument names, for the registry (which calls a check with the op's arguments by name).
def check_dsv4_qnorm_rope_kv_insert(q, kv, positions, swa_kv_cache_2d, slot_mapping, cos_sin_cache, q_head_padded,
                                    eps, cache_block_size) -> None:
    check_qnorm_rope_kv_insert(q, kv, positions, swa_kv_cache_2d, slot_mapping, cos_sin_cache, q_head_padded, eps,
                               cache_block_size)


def check_dsv4_compress_norm_rope_store(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                        rms_norm_eps, cos_sin_cache, kv_cache_2d, kv_cache_block_size,
                                        compress_ratio) -> None:
    check_compress_norm_rope_store("dsv4_compress_norm_rope_store", state_cache, gather_slots, positions,
                                   kv_slot_mapping, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d,
                                   kv_cache_block_size, compress_ratio, indexer=False)


def check_dsv4_compress_norm_rope_store_indexer(state_cache, gather_slots, positions, kv_slot_mapping,
                                                rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d,
                                                kv_cache_block_size, compress_ratio) -> None:
    check_compress_norm_rope_store("dsv4_compress_norm_rope_store_indexer", state_cache, gather_slots, positions,
                                   kv_slot_mapping, rms_norm_weight, rms_norm_eps, cos_sin_cache, kv_cache_2d,
                                   kv_cache_block_size, compress_ratio, indexer=True)


def check_dsv4_indexer_q_rope_quant(positions, index_q, index_q_cos_sin_cache, index_q_fp8, index_weights,
                                    index_weights_softmax_scale, index_weights_head_scale, index_weights_out) -> None:
    check_indexer_q_rope_quant(positions, index_q, index_q_cos_sin_cache, index_q_fp8, index_weights,
                               index_weights_softmax_scale, index_weights_head_scale, index_weights_out)
