"""Reference ops of DeepSeek V4.1's Engram: the n-gram hash ids of each token (from the chunk, the runner's lookback
ids, or the V1 slot-keyed history), the fp8 table lookup, and the gated add into the hyper-connection streams.
Contracts in `ascend_kernels.ops_dsv41`.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference.dsv4_layout import compute_dtype

DEAD_ID = -1  # a token that takes no part in an n-gram (vLLM's engram.DEAD_ID)


def _sources(ids: torch.Tensor, token_map: torch.Tensor, dead: torch.Tensor | None) -> torch.Tensor:
    """Compressed ids of token ids (int64), DEAD_ID where dead."""
    source = token_map.long().index_select(0, ids.reshape(-1).long()).view(ids.shape)
    return source if dead is None else torch.where(dead.bool(), torch.full_like(source, DEAD_ID), source)


def dsv41_engram_write_hash_cache(input_ids, token_map, dead_mask, slot_mapping, cache) -> None:
    n = slot_mapping.shape[0]
    slots = slot_mapping.long()
    keep = (slots >= 0).nonzero().squeeze(-1)
    ids = input_ids[:n].index_select(0, keep)
    dead = None if dead_mask is None else dead_mask[:n].index_select(0, keep)
    cache[slots.index_select(0, keep)] = _sources(ids, token_map, dead).to(cache.dtype)


def dsv41_engram_hash(input_ids, token_map, dead_mask, positions, block_table, query_start_loc, multipliers, primes,
                      offsets, cache, lookback_token_ids, lookback_dead_mask, pad_id: int,
                      cache_block_size: int) -> torch.Tensor:
    t = input_ids.shape[0]
    num_layers, max_ngram = multipliers.shape
    heads = primes.shape[-1]
    out = torch.empty(t, num_layers, (max_ngram - 1) * heads, dtype=torch.int32, device=input_ids.device)
    if t == 0:
        return out
    dev = input_ids.device
    token = torch.arange(t, device=dev)
    qsl = query_start_loc.long()
    num_reqs = qsl.shape[0] - 1
    req = torch.searchsorted(qsl[1:], token, right=True).clamp(max=num_reqs - 1)
    chunk_start = positions.long().index_select(0, qsl.index_select(0, req).clamp(max=t - 1))
    pos = positions[:t].long()
    depth = 0 if lookback_token_ids is None else lookback_token_ids.shape[1]
    mult = multipliers.long()
    blocked = torch.zeros(t, dtype=torch.bool, device=dev)
    rolling = torch.zeros(t, num_layers, dtype=torch.int64, device=dev)
    for shift in range(max_ngram):
        lookback = pos - shift
        in_batch = lookback >= chunk_start
        batch_idx = (token - shift).clamp_min(0)
        dead = None if dead_mask is None else dead_mask.index_select(0, batch_idx)
        source = _sources(input_ids.index_select(0, batch_idx), token_map, dead)
        col = chunk_start - 1 - lookback
        known = torch.zeros_like(in_batch)
        if depth:
            in_window = ~in_batch & (col >= 0) & (col < depth)
            col = col.clamp(0, depth - 1)
            window = lookback_token_ids.long()[req, col]
            known = in_window & (window >= 0)
            wdead = None if lookback_dead_mask is None else lookback_dead_mask[req, col]
            window_source = _sources(window.clamp_min(0), token_map, wdead)
            source = torch.where(in_batch, source, torch.where(known, window_source, source))
        if cache is not None:
            # the V1 runner's slot-keyed history of compressed ids, by the request's block table
            max_blocks = block_table.shape[1]
            clamped = lookback.clamp(0, max_blocks * cache_block_size - 1)
            row = req.clamp(max=block_table.shape[0] - 1)
            block = block_table.long()[row, clamped // cache_block_size]
            slot = (block * cache_block_size + clamped % cache_block_size).clamp(0, cache.shape[0] - 1)
            fallback = cache.long().index_select(0, slot)
        else:
            fallback = torch.full_like(source, pad_id)
        source = torch.where(in_batch | known, source, fallback)
        blocked |= (lookback < 0) | (source == DEAD_ID)
        value = torch.where(blocked, torch.full_like(source, pad_id), source)
        rolling ^= value.unsqueeze(1) * mult[:, shift].unsqueeze(0)
        if shift > 0:
            prime = primes[:, shift - 1].long()  # [layers, heads]
            offset = offsets[:, (shift - 1) * heads: shift * heads].long()
            out[:, :, (shift - 1) * heads: shift * heads] = (rolling.unsqueeze(-1) % prime + offset).to(torch.int32)
    return out


def dsv41_engram_lookup(weight, weight_scale_inv, indices, out) -> torch.Tensor:
    rows, dim = weight.shape
    block = dim // weight_scale_inv.shape[1]
    ids = indices.long()
    owned = (ids >= 0) & (ids < rows)
    local = torch.where(owned, ids, 0).reshape(-1)
    values = weight.index_select(0, local).float()
    exponents = weight_scale_inv.index_select(0, local).view(torch.uint8).to(torch.int32)
    # a UE8M0 byte is the float32 exponent field: 2^(e - 127); byte 0 reads as 0 and 255 as inf, as upstream's shift
    scale = (exponents << 23).view(torch.float32)
    deq = (values.view(-1, dim // block, block) * scale.unsqueeze(-1)).view(*ids.shape, dim)
    out.copy_(torch.where(owned.unsqueeze(-1), deq, torch.zeros_like(deq)).to(out.dtype))
    return out


def dsv41_engram_gate(hidden_states, kv, q_weight, k_weight, token_mask, eps: float,
                      clamp_value: float) -> torch.Tensor:
    t, hc, d = hidden_states.shape
    ct = compute_dtype(hidden_states.dtype)
    tk = min(kv.shape[0], t)
    h = hidden_states[:tk].to(ct)
    key = kv[:tk, : hc * d].to(ct).view(tk, hc, d)
    value = kv[:tk, hc * d: (hc + 1) * d].to(ct).unsqueeze(1)
    h_rms = torch.rsqrt(h.square().mean(-1) + eps)
    k_rms = torch.rsqrt(key.square().mean(-1) + eps)
    dot = (h * q_weight.to(ct) * k_weight.to(ct) * key).sum(-1) * h_rms * k_rms * (d ** -0.5)
    root = torch.sqrt(dot.abs().clamp_min(clamp_value))
    gate = torch.sigmoid(torch.where(dot < 0, -root, root))  # sign-preserving square root, + for a zero dot
    if token_mask is not None:
        gate = torch.where(token_mask[:tk].bool().unsqueeze(-1), gate, torch.zeros_like(gate))
    out = hidden_states.clone()
    out[:tk] = (h + gate.unsqueeze(-1) * value).to(out.dtype)
    return out
