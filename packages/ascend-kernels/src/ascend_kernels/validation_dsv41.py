"""Argument checks of the DeepSeek V4.1 ops (`ascend_kernels.ops_dsv41`): rank, shape, dtype and device only, as
`ascend_kernels.validation`."""

from __future__ import annotations

import torch

from ascend_kernels.validation import fail, floating, index, number, same_device, tensor


def _count(op: str, name: str, value: object, *, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        fail(op, name, value, f"an int >= {minimum}")


def _float_tensor(op: str, name: str, t: object, shape: tuple, dev, dims: str | None = None) -> None:
    """A float tensor of exactly `shape` (None entries: any size) on `dev` (None: any device)."""
    dims = dims or "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
    tensor(op, name, t, len(shape), dims)
    floating(op, name, t, dims)
    if any(s is not None and s != got for s, got in zip(shape, t.shape, strict=True)):
        fail(op, name, t, dims)
    if dev is not None:
        same_device(op, name, t, dev, dims)


def check_mhc_pre_delayed(residual, fn, hc_scale, hc_base, sinkhorn_repeat, pre_mix, x, norm_weight,
                          norm_eps) -> None:
    op = "dsv41_mhc_pre_delayed"
    _float_tensor(op, "residual", residual, (None, None, None), None, "[tokens, hc, hidden]")
    t, hc, hidden = residual.shape
    dev = residual.device
    mix = (2 + hc) * hc
    if x is not None:
        _float_tensor(op, "x", x, (t, None), dev, f"[{t}, input_size]")
    width = hc * hidden if x is None else x.shape[1]
    _float_tensor(op, "fn", fn, (mix, width), dev)
    _float_tensor(op, "hc_scale", hc_scale, (3,), dev)
    _float_tensor(op, "hc_base", hc_base, (mix,), dev)
    _count(op, "sinkhorn_repeat", sinkhorn_repeat)
    if pre_mix is not None:
        _float_tensor(op, "pre_mix", pre_mix, (t, hc), dev)
    if norm_weight is not None:
        _float_tensor(op, "norm_weight", norm_weight, (hidden,), dev)
        number(op, "norm_eps", norm_eps, "a positive real number", positive=True)




def _ints(op: str, name: str, t: object, dev, rows: int | None = None, *, at_least: bool = False,
          ndim: int = 1) -> None:
    dims = f"[{'>= ' if at_least else ''}{rows if rows is not None else 'n'}{', *' * (ndim - 1)}]"
    index(op, name, t, ndim, dims)
    same_device(op, name, t, dev, dims)
    if rows is not None and (t.shape[0] < rows if at_least else t.shape[0] != rows):
        fail(op, name, t, f"{dims} of dtype int32 or int64")


def _ratio(op: str, value: object) -> None:
    if isinstance(value, bool) or value not in (1, 2):
        fail(op, "compress_ratio", value, "1 or 2 (V4.1's ratios)")


def _cos_sin(op: str, name: str, t: object, dev, at_most: int) -> int:
    dims = f"[max_position, rope_dim <= {at_most}] ([cos | sin] halves)"
    _float_tensor(op, name, t, (None, None), dev, dims)
    if t.shape[1] % 2 or t.shape[1] > at_most:
        fail(op, name, t, dims)
    return t.shape[1]


def check_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
                             rms_norm_weight, rms_norm_eps, compress_ratio, latent_out) -> None:
    op = "dsv41_save_compress_norm"
    _ratio(op, compress_ratio)
    _float_tensor(op, "rms_norm_weight", rms_norm_weight, (None,), None, "[head_dim]")
    d = rms_norm_weight.shape[0]
    dev = rms_norm_weight.device
    _float_tensor(op, "kv_score", kv_score, (None, compress_ratio * d), dev)
    t = kv_score.shape[0]
    _ints(op, "slot_mapping", slot_mapping, dev)
    n = slot_mapping.shape[0]
    if n > t:
        fail(op, "slot_mapping", slot_mapping, f"[n <= {t}] (one kv_score row each)")
    _ints(op, "positions", positions, dev, n, at_least=True)
    _float_tensor(op, "latent_out", latent_out, (t, d), dev)
    number(op, "rms_norm_eps", rms_norm_eps, "a positive real number", positive=True)
    if compress_ratio == 2:
        _float_tensor(op, "state_cache", state_cache, (None, None, 2 * d), dev,
                      f"[num_blocks, capacity, {2 * d}] (the circular buffer: kv then score)")
        _ints(op, "query_start_loc", query_start_loc, dev)
        if query_start_loc.shape[0] < 1:
            fail(op, "query_start_loc", query_start_loc, "[num_reqs + 1]")
        _ints(op, "token_to_req_indices", token_to_req_indices, dev, n, at_least=True)


def check_rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio,
                            fp8_scale) -> None:
    op = "dsv41_rope_quant_insert"
    _ratio(op, compress_ratio)
    _float_tensor(op, "latent", latent, (None, None), None, "[tokens, head_dim]")
    t, d = latent.shape
    dev = latent.device
    _ints(op, "slot_mapping", slot_mapping, dev)
    n = slot_mapping.shape[0]
    if n > t:
        fail(op, "slot_mapping", slot_mapping, f"[n <= {t}] (one latent row each)")
    _ints(op, "positions", positions, dev, n, at_least=True)
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, dev, d)
    widths = {d + d // 32: "MXFP8"} if d % 32 == 0 else {}
    if d == 512:
        widths[584] = "fp8_ds_mla"
    dims = (f"[num_blocks, block_size, {d}] of a float dtype, or uint8 with a record width in "
            f"{sorted(widths) or 'none for this head_dim'}")
    tensor(op, "kv_cache", kv_cache, 3, dims)
    same_device(op, "kv_cache", kv_cache, dev, dims)
    if kv_cache.dtype == torch.uint8:
        if kv_cache.shape[2] not in widths or kv_cache.stride(2) != 1 or kv_cache.stride(1) != kv_cache.shape[2]:
            fail(op, "kv_cache", kv_cache, dims + " (pages contiguous)")
        return
    floating(op, "kv_cache", kv_cache, dims)
    if kv_cache.shape[2] != d:
        fail(op, "kv_cache", kv_cache, dims)
    if kv_cache.dtype == torch.float8_e4m3fn:
        _float_tensor(op, "fp8_scale", fp8_scale, (1,), dev, "a float32 [1] per-tensor scale")


def check_indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps, k_cache,
                                    kv_slot_mapping, compress_ratio, use_fp4_cache) -> None:
    op = "dsv41_indexer_k_norm_rope_store"
    _ratio(op, compress_ratio)
    _float_tensor(op, "k_pre", k_pre, (None, None), None, "[tokens, index_head_dim]")
    t, d = k_pre.shape
    dev = k_pre.device
    _ints(op, "kv_slot_mapping", kv_slot_mapping, dev)
    n = kv_slot_mapping.shape[0]
    if n > t:
        fail(op, "kv_slot_mapping", kv_slot_mapping, f"[n <= {t}] (one k_pre row each)")
    _ints(op, "positions", positions, dev, n, at_least=True)
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, dev, d)
    _float_tensor(op, "rms_norm_weight", rms_norm_weight, (d,), dev)
    number(op, "rms_norm_eps", rms_norm_eps, "a positive real number", positive=True)
    dims = f"a uint8 [num_blocks, block_size, {d + 4}] cache (pages contiguous: fp8 records, then float32 scales)"
    tensor(op, "k_cache", k_cache, 3, dims)
    same_device(op, "k_cache", k_cache, dev, dims)
    if k_cache.dtype != torch.uint8 or k_cache.shape[2] != d + 4 or k_cache.stride(2) != 1 or \
            k_cache.stride(1) != d + 4:
        fail(op, "k_cache", k_cache, dims)
    if use_fp4_cache is not False:
        fail(op, "use_fp4_cache", use_fp4_cache, "False (the MXFP4 indexer cache is not supported)")


def check_candidate_blocks(op, logits, row_ks, row_ke, block_size, row_repeat, blocks, blocks_name,
                           topk_blocks) -> None:
    _float_tensor(op, "logits", logits, (None, None), None, "[rows, width]")
    rows = logits.shape[0]
    dev = logits.device
    _count(op, "block_size", block_size)
    _count(op, "row_repeat", row_repeat)
    groups = -(-rows // row_repeat)
    _ints(op, "row_ke", row_ke, dev, groups, at_least=True)
    if row_ks is not None:
        _ints(op, "row_ks", row_ks, dev, groups, at_least=True)
    _ints(op, blocks_name, blocks, dev, rows, at_least=True, ndim=2)
    if topk_blocks is not None:
        _count(op, "topk_blocks", topk_blocks)
        if blocks.shape[1] < topk_blocks:
            fail(op, blocks_name, blocks, f"[{rows}, >= {topk_blocks}] of dtype int32 or int64")


def _bools(op: str, name: str, t: object, shape: tuple, dev) -> None:
    dims = "[" + ", ".join(str(x) for x in shape) + "] of dtype bool, or None"
    if t is None:
        return
    if not isinstance(t, torch.Tensor) or t.dtype != torch.bool or t.dim() != len(shape) or \
            any(got < want for got, want in zip(t.shape, shape, strict=True)):
        fail(op, name, t, dims)
    same_device(op, name, t, dev, dims)


def check_engram_write_hash_cache(input_ids, token_map, dead_mask, slot_mapping, cache) -> None:
    op = "dsv41_engram_write_hash_cache"
    index(op, "slot_mapping", slot_mapping, 1, "[n]")
    n = slot_mapping.shape[0]
    dev = slot_mapping.device
    _ints(op, "input_ids", input_ids, dev, n, at_least=True)
    _ints(op, "token_map", token_map, dev)
    _bools(op, "dead_mask", dead_mask, (n,), dev)
    _ints(op, "cache", cache, dev)


def check_engram_hash(input_ids, token_map, dead_mask, positions, block_table, query_start_loc, multipliers, primes,
                      offsets, cache, lookback_token_ids, lookback_dead_mask, pad_id, cache_block_size) -> None:
    op = "dsv41_engram_hash"
    index(op, "input_ids", input_ids, 1, "[T]")
    t = input_ids.shape[0]
    dev = input_ids.device
    _ints(op, "token_map", token_map, dev)
    _bools(op, "dead_mask", dead_mask, (t,), dev)
    _ints(op, "positions", positions, dev, t, at_least=True)
    _ints(op, "query_start_loc", query_start_loc, dev)
    if query_start_loc.shape[0] < 2:
        fail(op, "query_start_loc", query_start_loc, "[num_reqs + 1 >= 2]")
    r = query_start_loc.shape[0] - 1
    _ints(op, "multipliers", multipliers, dev, ndim=2)
    num_layers, max_ngram = multipliers.shape
    if max_ngram < 2:
        fail(op, "multipliers", multipliers, "[layers, max_ngram >= 2] of dtype int32 or int64")
    _ints(op, "primes", primes, dev, num_layers, ndim=3)
    if primes.shape[1] != max_ngram - 1:
        fail(op, "primes", primes, f"[{num_layers}, {max_ngram - 1}, heads] of dtype int32 or int64")
    _ints(op, "offsets", offsets, dev, num_layers, ndim=2)
    if offsets.shape[1] != (max_ngram - 1) * primes.shape[2]:
        fail(op, "offsets", offsets, f"[{num_layers}, {(max_ngram - 1) * primes.shape[2]}] of dtype int32 or int64")
    if lookback_token_ids is not None:
        _ints(op, "lookback_token_ids", lookback_token_ids, dev, r, at_least=True, ndim=2)
        _bools(op, "lookback_dead_mask", lookback_dead_mask, tuple(lookback_token_ids.shape), dev)
    if cache is not None:
        _ints(op, "cache", cache, dev)
        _ints(op, "block_table", block_table, dev, ndim=2)
        _count(op, "cache_block_size", cache_block_size)
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or pad_id < 0:
        fail(op, "pad_id", pad_id, "an int >= 0 (a compressed id)")


def check_engram_lookup(weight, weight_scale_inv, indices, out) -> None:
    op = "dsv41_engram_lookup"
    _float_tensor(op, "weight", weight, (None, None), None, "[rows, dim] (float8_e4m3fn)")
    rows, dim = weight.shape
    dev = weight.device
    dims = f"[{rows}, dim // block] UE8M0 bytes (uint8 or float8_e8m0fnu)"
    tensor(op, "weight_scale_inv", weight_scale_inv, 2, dims)
    scale_dtypes = {torch.uint8, getattr(torch, "float8_e8m0fnu", torch.uint8)}
    if weight_scale_inv.dtype not in scale_dtypes or weight_scale_inv.shape[0] != rows or \
            weight_scale_inv.shape[1] < 1 or dim % weight_scale_inv.shape[1]:
        fail(op, "weight_scale_inv", weight_scale_inv, dims)
    same_device(op, "weight_scale_inv", weight_scale_inv, dev, dims)
    _ints(op, "indices", indices, dev, ndim=2)
    _float_tensor(op, "out", out, (indices.shape[0], indices.shape[1], dim), dev)


def check_engram_gate(hidden_states, kv, q_weight, k_weight, token_mask, eps, clamp_value) -> None:
    op = "dsv41_engram_gate"
    _float_tensor(op, "hidden_states", hidden_states, (None, None, None), None, "[T, hc, d]")
    _, hc, d = hidden_states.shape
    dev = hidden_states.device
    _float_tensor(op, "kv", kv, (None, (hc + 1) * d), dev, f"[Tk, {(hc + 1) * d}]")
    _float_tensor(op, "q_weight", q_weight, (hc, d), dev)
    _float_tensor(op, "k_weight", k_weight, (hc, d), dev)
    _bools(op, "token_mask", token_mask, (kv.shape[0],), dev)
    if token_mask is not None and token_mask.dim() == 1 and token_mask.shape[0] != kv.shape[0]:
        fail(op, "token_mask", token_mask, f"[{kv.shape[0]}] of dtype bool, or None")
    number(op, "eps", eps, "a positive real number", positive=True)
    number(op, "clamp_value", clamp_value, "a positive real number", positive=True)


def check_hc_collapse(x, pre_mix) -> None:
    op = "dsv41_hc_collapse"
    _float_tensor(op, "x", x, (None, None, None), None, "[tokens, hc, hidden]")
    _float_tensor(op, "pre_mix", pre_mix, (x.shape[0], x.shape[1]), x.device)


def check_q_rope_kv_insert(q, kv, positions, cache, slot_mapping, cos_sin_cache, block_size) -> None:
    op = "dsv41_q_rope_kv_insert"
    _float_tensor(op, "q", q, (None, None, None), None, "[tokens, heads, head_dim]")
    t, _, d = q.shape
    dev = q.device
    _ints(op, "positions", positions, dev, t, at_least=True)
    _ints(op, "slot_mapping", slot_mapping, dev)
    n = slot_mapping.shape[0]
    _float_tensor(op, "kv", kv, (None, d), dev, f"[>= {n}, {d}]")
    if kv.shape[0] < n or n > t:
        fail(op, "slot_mapping", slot_mapping, f"[n <= {min(t, kv.shape[0])}] (one q and kv row each)")
    _cos_sin(op, "cos_sin_cache", cos_sin_cache, dev, d)
    _count(op, "cache_block_size", block_size)
    dims = f"[blocks, {block_size}, {d}] (or [blocks, >= {block_size * d}]) of a float dtype"
    if not isinstance(cache, torch.Tensor) or not cache.is_floating_point() or \
            (cache.dim() == 3 and tuple(cache.shape[1:]) != (block_size, d)) or \
            (cache.dim() == 2 and cache.shape[1] < block_size * d) or cache.dim() not in (2, 3):
        fail(op, "swa_kv_cache", cache, dims)
    same_device(op, "swa_kv_cache", cache, dev, dims)


# The ops' own argument names, for the registry (which calls a check with the op's arguments by name).
def check_dsv41_q_rope_kv_insert(q, kv, positions, swa_kv_cache, slot_mapping, cos_sin_cache,
                                 cache_block_size) -> None:
    check_q_rope_kv_insert(q, kv, positions, swa_kv_cache, slot_mapping, cos_sin_cache, cache_block_size)


def check_dsv41_select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out, row_repeat) -> None:
    check_candidate_blocks("dsv41_select_candidate_blocks", logits, row_ks, row_ke, block_size, row_repeat, out, "out",
                           topk_blocks)


def check_dsv41_apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat) -> None:
    check_candidate_blocks("dsv41_apply_candidate_mask", logits, row_ks, row_ke, block_size, row_repeat,
                           candidate_blocks, "candidate_blocks", None)
