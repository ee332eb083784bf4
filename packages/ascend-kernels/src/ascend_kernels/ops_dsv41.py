"""DeepSeek V4.1 ops of the kernel facade (re-exported by `ascend_kernels.ops`).

Each op mirrors one of vLLM 0.32's V4.1 torch / Triton functions argument for argument (named in its docstring; paths
relative to `vllm/`), in-place writes and return values included, so the model code swaps one call for the other.
Unlike upstream (bf16 activations, head_dim 512 and index head_dim 128 hard-coded) every op takes any float dtype
(float32 included; arithmetic in float32, float64 inputs in float64) and derives widths from its arguments. Where
upstream rounds through bf16 on purpose (the compressor latent, the index key) the ops round too. The ops V4.1 shares
with V4 (sparse MLA, the indexer query, paged MQA logits, top-k, inverse RoPE, mHC post) stay in
`ascend_kernels.ops_dsv4`.
"""

from __future__ import annotations

from ascend_kernels import reference as ref
from ascend_kernels import validation_dsv41 as _vd
from ascend_kernels.op_registry import kernel_op, reference_on_device

__all__ = [
    "dsv41_mhc_pre_delayed",
    "dsv41_hc_collapse",
    "dsv41_q_rope_kv_insert",
    "dsv41_save_compress_norm",
    "dsv41_rope_quant_insert",
    "dsv41_indexer_k_norm_rope_store",
    "dsv41_select_candidate_blocks",
    "dsv41_apply_candidate_mask",
    "dsv41_engram_write_hash_cache",
    "dsv41_engram_hash",
    "dsv41_engram_lookup",
    "dsv41_engram_gate",
]


@kernel_op(validate=_vd.check_mhc_pre_delayed, reference=ref.dsv41_mhc_pre_delayed,
           npu=reference_on_device("dsv41_hyper", "one matmul, sigmoid/softmax and the Sinkhorn loop"))
def dsv41_mhc_pre_delayed(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float,
                          hc_sinkhorn_eps: float, hc_post_mult_value: float, sinkhorn_repeat: int, pre_mix=None,
                          x=None, norm_weight=None, norm_eps: float = 1e-6):
    """`model_executor/kernels/mhc/torch.py::mhc_pre_delayed_torch` (+ the tilelang variant's optional norm).

    residual float `[tokens, hc, hidden]`; x (optional) float `[tokens, input_size]`, the projection input instead of
    the flattened residual (V4.1's first layer: the raw embedding with fn summed over the copies); fn float `[(2 +
    hc) * hc, input_size]` (input_size = hc * hidden without x), hc_scale `[3]`, hc_base `[(2 + hc) * hc]`. mixes =
    `(x @ fn.T) * rsqrt(mean(x^2) + rms_eps)`; pre, post and comb as `dsv4_mhc_pre`. The layer input is collapsed
    with pre_mix float `[tokens, hc]` (the PREVIOUS sublayer's pre): `sum_j pre_mix[j] * residual[j]`, or
    `residual[:, 0]` when pre_mix is None (model entry); with norm_weight float `[hidden]` (vLLM's tilelang
    `norm_weight` / `norm_eps`) that input is RMSNorm'd. Returns (post float32 `[tokens, hc, 1]`, comb float32
    `[tokens, hc, hc]`, layer_input `[tokens, hidden]` in residual's dtype, pre float32 `[tokens, hc]`: this block's
    coefficients for the next sublayer); float64 residuals give float64 mixes.
    """


@kernel_op(validate=_vd.check_hc_collapse, reference=ref.dsv41_hc_collapse,
           npu=reference_on_device("dsv41_hyper", "a weighted sum"))
def dsv41_hc_collapse(x, pre_mix):
    """`model_executor/kernels/mhc/triton.py::hc_collapse_triton`: the final collapse of the streams (V4.1 has no
    learned head). x float `[tokens, hc, hidden]`, pre_mix float `[tokens, hc]` (the last FFN's pre); returns
    `sum_j pre_mix[j] * x[j]` `[tokens, hidden]` in x's dtype (float32 products and sum, float64 for float64 x)."""


@kernel_op(validate=_vd.check_dsv41_q_rope_kv_insert, reference=ref.dsv41_q_rope_kv_insert,
           npu=reference_on_device("dsv41_attention", "elementwise RoPE and a scatter by slot"))
def dsv41_q_rope_kv_insert(q, kv, positions, swa_kv_cache, slot_mapping, cos_sin_cache,
                           cache_block_size: int):
    """V4.1's plain-row sliding-window insert (vLLM: `fused_deepseek_v4_qnorm_rope_kv_rope_full_cache_bf16_insert`
    with apply_q_norm=False; that one is bf16 only and rotates q in place).

    q float `[tokens, heads, head_dim]`: returns a new tensor in q's dtype with the last rope_dim (cos_sin_cache's
    width) dims GPT-J rotated at positions[t] (no query norm: V4.1 norms q before wq_b). kv float `[>= n, head_dim]`
    (n = `slot_mapping.shape[0]`): for slot >= 0 the row, rotated the same way, is stored in its own dtype (any float
    dtype; float32 keeps it exact) at `(slot // cache_block_size, slot % cache_block_size)` of swa_kv_cache `[blocks,
    cache_block_size, head_dim]` (or its `[blocks, >= cache_block_size * head_dim]` flat view).
    """


# ------------------------------------------------------------------------------ compressor and cache inserts


@kernel_op(validate=_vd.check_save_compress_norm, reference=ref.dsv41_save_compress_norm,
           npu=reference_on_device("dsv41_compressor", "one host loop over the requests for the ring store"))
def dsv41_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc, token_to_req_indices,
                             rms_norm_weight, rms_norm_eps: float, compress_ratio: int, latent_out) -> None:
    """`models/deepseek_v41/common/ops/fused_compress_quant_cache.py::fused_save_compress_norm`, in place.

    n = `slot_mapping.shape[0]` tokens (kv_score / positions / latent_out may have more rows; those stay untouched).
    kv_score float `[>= n, compress_ratio * head_dim]` (head_dim = `rms_norm_weight.shape[0]`, 512 upstream): `[kv]`
    for ratio 1, `[kv | score]` for ratio 2. Ratio 1: slot_mapping (the compressed cache's slots) only marks valid
    tokens; latent_out[t] = `RMSNorm(kv[t]) * rms_norm_weight` for slot >= 0. Ratio 2: state_cache float `[blocks,
    capacity, 2 * head_dim]` is the circular buffer (one block per request, slot = `block * capacity + p %
    capacity`), query_start_loc int `[num_reqs + 1]` and token_to_req_indices int `[>= n]` the chunk bounds. A token
    with an odd position p and slot >= 0 closes the group (p - 1, p): pooled = per-dim softmax over the two score
    rows, weighting the two kv rows; the partner row is the previous token's raw row, or, for a chunk's first token,
    row `(p - 1) % capacity` of its ring block; latent_out[t] = RMSNorm(pooled) * weight. After every read, each
    chunk whose first slot is >= 0 stores its last min(len, capacity) raw rows `[kv | score]` at their slots. Latents
    are rounded through bfloat16 (upstream's latent is bf16) and stored in latent_out's float dtype; rows of other
    tokens are not written.
    """


@kernel_op(validate=_vd.check_rope_quant_insert, reference=ref.dsv41_rope_quant_insert,
           npu=reference_on_device("dsv41_compressor", "one nonzero() sync per call"))
def dsv41_rope_quant_insert(latent, positions, cos_sin_cache, kv_cache, slot_mapping, compress_ratio: int,
                            fp8_scale=None) -> None:
    """`models/deepseek_v41/common/ops/fused_compress_quant_cache.py::rope_quant_insert`: publish latents, in place.

    For t < n = `slot_mapping.shape[0]` with slot >= 0 and `(p + 1) % compress_ratio == 0`: latent float `[>= n,
    head_dim]` row t, its last rope_dim (= cos_sin_cache's width, 64) dims GPT-J rotated at the group's first position
    `p // compress_ratio * compress_ratio` (cos_sin_cache float `[max_pos, rope_dim]`, `[cos | sin]`), stored at slot
    (`block * block_size + entry`, block_size = `kv_cache.shape[1]`) of kv_cache `[num_blocks, block_size, width]`:
    - a float cache (width head_dim; upstream bfloat16 only, here any float dtype): the row in the cache's dtype;
    - float8_e4m3fn (width head_dim): the bf16-rounded row times `1 / fp8_scale` (float32, one element), clamped;
    - uint8 with width `head_dim + head_dim // 32` (528): MXFP8, per page the block_size value records (all dims fp8)
      then block_size records of UE8M0 exponents, one per 32 dims;
    - uint8 with width 584 (head_dim 512): fp8_ds_mla, 448 fp8 nope bytes + 64 bf16 rope values, then 7 UE8M0
      exponents (one per 64 nope dims) and a zero byte.
    fp8 scales are `2^ceil(log2(max(amax, 1e-4) / 448))` per block, values clamped to +-448, rounded to nearest even.
    """


@kernel_op(validate=_vd.check_indexer_k_norm_rope_store, reference=ref.dsv41_indexer_k_norm_rope_store,
           npu=reference_on_device("dsv41_compressor", "one nonzero() sync per call"))
def dsv41_indexer_k_norm_rope_store(k_pre, positions, cos_sin_cache, rms_norm_weight, rms_norm_eps: float, k_cache,
                                    kv_slot_mapping, compress_ratio: int, use_fp4_cache: bool = False) -> None:
    """`models/deepseek_v41/common/ops/indexer_k_store.py::indexer_k_norm_rope_store`: index keys, in place.

    For t < n = `kv_slot_mapping.shape[0]` with slot >= 0 and `(p + 1) % compress_ratio == 0`: k_pre float `[>= n,
    index_head_dim]` (the caller's `wk(latent)`, read as is) -> `RMSNorm(k) * rms_norm_weight` rounded through bf16,
    the last rope_dim (cos_sin_cache's width) dims GPT-J rotated at `p // compress_ratio * compress_ratio`, the row
    rounded through bf16 again, then fp8 with one scale `2^ceil(log2(max(amax, 1e-4) / 448))`, into k_cache uint8
    `[num_blocks, block_size, index_head_dim + 4]` (V4's indexer page layout: block_size fp8 records, then block_size
    float32 scales; what `dsv4_fp8_paged_mqa_logits` reads, as `k_cache.view(num_blocks, -1)`). use_fp4_cache (the
    MXFP4 cache) is not supported: it must be False.
    """


# ------------------------------------------------------------------------------------ candidate blocks


@kernel_op(validate=_vd.check_dsv41_select_candidate_blocks, reference=ref.dsv41_select_candidate_blocks,
           npu=reference_on_device("dsv41_indexer", "a block max and a topk over the rows"))
def dsv41_select_candidate_blocks(logits, row_ks, row_ke, topk_blocks: int, block_size: int, out,
                                  row_repeat: int = 1) -> None:
    """`model_executor/kernels/attention/dsa/candidate_blocks.py::select_candidate_blocks`, in place.

    logits float `[rows, width]` (packed columns: row i reads `[start, end)` with start = row_ks[i // row_repeat]
    (0 when row_ks is None) and end = row_ke[i // row_repeat], int `[>= rows / row_repeat]`). Blocks are local:
    block b holds columns `start + b * block_size ...` (up to end and width); its score is the max logit (NaN
    propagates; -inf when empty), the row's newest block `(end - start - 1) // block_size` +inf when end > start.
    out int `[rows, >= topk_blocks]`: the first topk_blocks columns get the ids of the min(topk_blocks,
    ceil(width / block_size)) best blocks by torch's topk (best first), -1 for -inf scores and past that.
    """


@kernel_op(validate=_vd.check_dsv41_apply_candidate_mask, reference=ref.dsv41_apply_candidate_mask,
           npu=reference_on_device("dsv41_indexer", "a scatter of block flags and one masked_fill"))
def dsv41_apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size: int,
                               row_repeat: int = 1) -> None:
    """`model_executor/kernels/attention/dsa/candidate_blocks.py::apply_candidate_mask`, in place.

    logits, row_ks, row_ke as `dsv41_select_candidate_blocks`; candidate_blocks int `[rows, K]` (-1 padded). Sets
    every column of a row to -inf unless it lies in `[start, end)` and in a listed block; as upstream, a listed block
    starting at or past width instead keeps the last column (width - 1) if that is in bounds.
    """


# ------------------------------------------------------------------------------------------------ Engram


@kernel_op(validate=_vd.check_engram_write_hash_cache, reference=ref.dsv41_engram_write_hash_cache,
           npu=reference_on_device("dsv41_engram", "scatter by slot"))
def dsv41_engram_write_hash_cache(input_ids, token_map, dead_mask, slot_mapping, cache) -> None:
    """`models/deepseek_v41/common/engram.py::_write_hash_cache_kernel` (the V1 runner's history), in place.

    For t < `slot_mapping.shape[0]` with slot >= 0: cache int `[num_slots]` (keyed like the first layer's sliding-
    window slots) gets `token_map[input_ids[t]]` (token_map int `[vocab]`: the compressed ids), or -1 (DEAD_ID) where
    dead_mask bool `[>= n]` is set (None: no dead tokens).
    """


@kernel_op(validate=_vd.check_engram_hash, reference=ref.dsv41_engram_hash,
           npu=reference_on_device("dsv41_engram", "one int64 pass per n-gram length"))
def dsv41_engram_hash(input_ids, token_map, dead_mask, positions, block_table, query_start_loc, multipliers, primes,
                      offsets, cache, lookback_token_ids, lookback_dead_mask, pad_id: int,
                      cache_block_size: int = 1):
    """`NgramHashState.forward`'s `_hash_ids_kernel` (engram.py): each token's n-gram hash ids.

    T = `input_ids.shape[0]` tokens in requests by query_start_loc int `[R + 1]` (padding tokens past the last bound
    count as the last request's); positions int `[>= T]`; a request's chunk starts at the position of its first
    token. Token t looks back s = 0 .. max_ngram - 1 positions: p - s inside the chunk reads input_ids[t - s];
    before it, column `chunk_start - 1 - (p - s)` of lookback_token_ids int `[R, depth]` (Model Runner V2's lookback
    ids, -1 unknown; None or depth 0: none), else the V1 history cache int `[num_slots]` through block_table int
    `[R, max_blocks]` (slot `block * cache_block_size + offset`, both clamped as upstream), else pad_id. Ids map
    through token_map (dead_mask / lookback_dead_mask bool, or None: -1 = DEAD_ID); once a lookback is before
    position 0 or dead, it and all longer ones read pad_id. rolling ^= value * multipliers[l, s] (int64 `[L,
    max_ngram]`); for s >= 1 and head h: `rolling % primes[l, s - 1, h] + offsets[l, (s - 1) * H + h]` (primes int
    `[L, max_ngram - 1, H]`, offsets int `[L, (max_ngram - 1) * H]`). Returns int32 `[T, L, (max_ngram - 1) * H]`.
    """


@kernel_op(validate=_vd.check_engram_lookup, reference=ref.dsv41_engram_lookup,
           npu=reference_on_device("dsv41_engram", "a row gather and the UE8M0 dequantization"))
def dsv41_engram_lookup(weight, weight_scale_inv, indices, out):
    """`ParallelEngramEmbedding.lookup` (one shard holding every head; engram.py `_engram_lookup_kernel`), in place.

    weight float8_e4m3fn `[rows, dim]` (or any float dtype holding the fp8 values), weight_scale_inv uint8 (or
    float8_e8m0fnu) `[rows, dim // block]` UE8M0 exponents, indices int `[T, cols]`, out float `[T, cols, dim]` (any
    float dtype; upstream bfloat16): `weight[i] * 2^(e - 127)` per block of dims (byte 0 reads as 0, 255 as inf, as
    upstream's bit shift), zeros for ids outside [0, rows) (DEAD_ID rows). Returns out.
    """


@kernel_op(validate=_vd.check_engram_gate, reference=ref.dsv41_engram_gate,
           npu=reference_on_device("dsv41_engram", "elementwise with two row norms"))
def dsv41_engram_gate(hidden_states, kv, q_weight, k_weight, token_mask, eps: float, clamp_value: float = 1e-6):
    """`Engram.forward` after `wkv` (engram.py `_fused_engram_post_wkv_kernel`): the gated add into the streams.

    hidden_states float `[T, hc, d]`, kv float `[Tk, (hc + 1) * d]` (`wkv(lookup)`: one key per stream, then the
    shared value), q_weight / k_weight float `[hc, d]`, token_mask bool `[Tk]` or None. For t < Tk and stream j:
    `dot = sum(h * q_w[j] * k_w[j] * key_j) * rsqrt(mean(h^2) + eps) * rsqrt(mean(key_j^2) + eps) / sqrt(d)`, gate
    = `sigmoid(sign(dot) * sqrt(max(|dot|, clamp_value)))` (0 where token_mask is False), out = h + gate * value;
    rows t >= Tk pass through. Returns a new tensor in hidden_states' dtype.
    """
