"""DeepSeek V4 attention ops of the kernel facade (re-exported by `ascend_kernels.ops`).

Each op mirrors one of vLLM's DeepSeek V4 CPU ops (`vllm._custom_ops.<name>_cpu`, csrc/cpu/sgl-kernels/) argument for
argument, outputs and in-place writes included, so the model code swaps one call for the other; unlike those, every
op takes any float dtype for activations (float32 included; they compute in float32, float64 inputs in float64), any
top-k and any head count. Cache byte layouts (fp8_ds_mla, the indexer K cache) are vLLM's, described in
`ascend_kernels.reference.dsv4_layout`; fp8 quantization (UE8M0 / power-of-two scales, the bf16 round trips before
it, round-to-nearest-even) follows the C++ kernels bit for bit. Slots are flat `block * block_size + offset` ids, -1
(or, where said, out of range) meaning none.
"""

from __future__ import annotations

import torch

from ascend_kernels import reference as ref
from ascend_kernels import validation_dsv4 as _vd
from ascend_kernels.op_registry import kernel_op, reference_on_device

__all__ = [
    "dsv4_qnorm_rope_kv_insert",
    "dsv4_save_partial_states",
    "dsv4_compress_norm_rope_store",
    "dsv4_compress_norm_rope_store_indexer",
    "dsv4_indexer_q_rope_quant",
    "dsv4_fp8_paged_mqa_logits",
    "dsv4_topk_transform",
    "dsv4_sparse_mla_with_kvcache",
    "dsv4_inverse_rope_o_proj",
    "dsv4_mhc_pre",
    "dsv4_mhc_post",
    "dsv4_hc_head",
]


@kernel_op(validate=_vd.check_dsv4_qnorm_rope_kv_insert, reference=ref.dsv4_qnorm_rope_kv_insert,
           npu=reference_on_device("dsv4_attention", "fp8_ds_mla insert with UE8M0 tile scales"))
def dsv4_qnorm_rope_kv_insert(q, kv, positions, swa_kv_cache_2d, slot_mapping, cos_sin_cache, q_head_padded: int,
                              eps: float, cache_block_size: int, *, apply_q_norm: bool = True) -> torch.Tensor:
    """`fused_qnorm_rope_kv_insert_cpu`: the queries' weight-free RMSNorm + GPT-J RoPE, and the KV insert.

    q float `[num_tokens, num_heads, head_dim]` (head_dim = nope + 64 rope dims, nope a multiple of 64); per head:
    `x / sqrt(mean(x^2) + eps)`, then the last 64 dims rotated (interleaved pairs) at `positions[t]` (int
    `[num_tokens]`) by cos_sin_cache float `[max_pos, 64]` (`[cos(32) | sin(32)]`). Returns `[num_tokens,
    q_head_padded, head_dim]` in q's dtype, heads past num_heads zero. KV: kv row t (`[>= num_insert, head_dim]`) for
    t < num_insert = `slot_mapping.shape[0]`: RoPE at positions[t], the row rounded through bf16, stored at
    slot_mapping[t] (-1 skipped) into swa_kv_cache_2d (fp8_ds_mla, cache_block_size records per row) with UE8M0 tile
    scales; like the upstream kernel, values below fp8's smallest normal are flushed to zero. apply_q_norm=False
    (DeepSeek V4.1, whose query is normed before wq_b: upstream's `apply_q_norm` argument) skips the query norm.
    """


@kernel_op(validate=_vd.check_save_partial_states, reference=ref.dsv4_save_partial_states,
           npu=reference_on_device("dsv4_compressor", "scatter by slot"))
def dsv4_save_partial_states(kv, score, ape, positions, state_cache, slot_mapping) -> None:
    """`save_partial_states_cpu`: each token's compressor inputs into its state-cache slot, in place.

    kv, score float `[num_tokens, state_width]` (row strides may exceed the width: column views of one projection),
    ape float `[compress_ratio, state_width]`, positions / slot_mapping int `[num_tokens]` (-1 skipped); state_cache
    float `[num_blocks, block_size, 2 * state_width]` (strided views allowed): slot s gets `[kv[t] | score[t] +
    ape[positions[t] % compress_ratio]]`, added in the state cache's precision.
    """


@kernel_op(validate=_vd.check_dsv4_compress_norm_rope_store, reference=ref.dsv4_compress_norm_rope_store,
           npu=reference_on_device("dsv4_compressor", "one nonzero() sync per call"))
def dsv4_compress_norm_rope_store(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                  rms_norm_eps: float, cos_sin_cache, kv_cache_2d, kv_cache_block_size: int,
                                  compress_ratio: int) -> None:
    """`compress_norm_rope_store_cpu`: compress a window of states into one fp8_ds_mla cache entry, in place.

    Only tokens whose position closes a block (`(p + 1) % compress_ratio == 0`) and whose kv_slot_mapping entry is
    >= 0 produce an entry. Over the window gather_slots int `[num_tokens, window]` (state-cache slots, -1 skipped;
    window <= compress_ratio, or 2 * compress_ratio with overlapping states whose entries w >= compress_ratio read
    the second head_dim half): per channel softmax of the scores, the weighted sum of the kvs, RMSNorm with
    rms_norm_weight float `[head_dim]` (head_dim = nope + 64), GPT-J RoPE of the last 64 dims at the block's first
    position `(p // compress_ratio) * compress_ratio`; the nope dims rounded through bf16 then fp8 with UE8M0 tile
    scales (exact subnormals), the rope dims stored as bf16, at kv_slot_mapping[t] of kv_cache_2d.
    """


@kernel_op(validate=_vd.check_dsv4_compress_norm_rope_store_indexer,
           reference=ref.dsv4_compress_norm_rope_store_indexer,
           npu=reference_on_device("dsv4_compressor", "one nonzero() sync per call"))
def dsv4_compress_norm_rope_store_indexer(state_cache, gather_slots, positions, kv_slot_mapping, rms_norm_weight,
                                          rms_norm_eps: float, cos_sin_cache, kv_cache_2d, kv_cache_block_size: int,
                                          compress_ratio: int) -> None:
    """`compress_norm_rope_store_indexer_cpu`: `dsv4_compress_norm_rope_store`'s pooling, norm and RoPE (rope_dim =
    cos_sin_cache's width, any head_dim above it) into the indexer K cache: the whole rotated row rounded through
    bf16, then one fp8 block with scale `2^ceil(log2(max(amax, 1e-4) / 448))` stored as a plain float32."""


@kernel_op(validate=_vd.check_dsv4_indexer_q_rope_quant, reference=ref.dsv4_indexer_q_rope_quant,
           npu=reference_on_device("dsv4_indexer", "float8_e4m3fn casts on the device"))
def dsv4_indexer_q_rope_quant(positions, index_q, index_q_cos_sin_cache, index_q_fp8, index_weights,
                              index_weights_softmax_scale: float, index_weights_head_scale: float,
                              index_weights_out) -> None:
    """`fused_indexer_q_rope_quant_cpu`: the indexer query's RoPE + per-(token, head) fp8 quantization, in place.

    index_q float `[>= num_tokens, heads, head_dim]` (read as float32; num_tokens = `positions.shape[0]`, later rows
    and their outputs untouched, as upstream); the last rope_dim (= the cache's width) dims
    rotated GPT-J style at positions and rounded through bf16, the nope dims not; one power-of-two scale per (token,
    head) `2^ceil(log2(max(amax, 1e-4) / 448))`. index_q_fp8 `[num_tokens, heads, head_dim]` (float8_e4m3fn, or any
    float dtype, which then holds the fp8 values) gets the quantized row; index_weights_out float `[num_tokens,
    heads]` gets `index_weights * scale * softmax_scale * head_scale` (float32 products in that order).
    """


@kernel_op(validate=_vd.check_fp8_paged_mqa_logits, reference=ref.dsv4_fp8_paged_mqa_logits,
           npu=reference_on_device("dsv4_indexer", "dequantizes the visible keys per chunk of rows"))
def dsv4_fp8_paged_mqa_logits(q_fp8, kvcache_fp8, weight, seq_lens, page_table, block_size: int,
                              max_seq_len: int) -> torch.Tensor:
    """`fp8_paged_mqa_logits_cpu`: the indexer's logits of each row over its paged K cache.

    q_fp8 `[batch, heads, head_dim]` (float8_e4m3fn or any float dtype, read as float32), weight float `[batch,
    heads]`, seq_lens int `[batch]`, page_table int `[batch, pages]`; kvcache_fp8 the indexer cache (block_size
    records per row). Returns float32 `[batch, max_seq_len]`: for j < seq_len[b], `scale_j * sum_h weight[b, h] *
    relu(q[b, h] . k_j)` with k_j the fp8 record of position j (page `page_table[b, j // block_size]`); -inf past
    seq_len (upstream leaves those entries uninitialized; its only consumer never reads them).
    """


@kernel_op(validate=_vd.check_topk_transform, reference=ref.dsv4_topk_transform,
           npu=reference_on_device("dsv4_indexer", "a stable sort per row"))
def dsv4_topk_transform(scores, seq_lens, page_tables, out_page_indices, page_size: int,
                        out_raw_indices=None) -> None:
    """`topk_transform_512_cpu` for any top-k: each row's best positions, in place.

    topk = `out_page_indices.shape[1]` (upstream: 512 always, writing the first 512 columns). scores float `[batch,
    max_seq_len]`, seq_lens int `[batch]` (clamped to max_seq_len), page_tables int `[batch, pages]`. A row with
    seq_len <= topk selects positions 0..seq_len-1; a longer one the topk highest scores among j < seq_len (equal
    scores: lower position first). Selected positions in ascending order (upstream leaves a long row in heap order;
    consumers treat the row as a set), then -1. out_raw_indices (optional, same shape) gets the positions,
    out_page_indices `page_tables[b, j // page_size] * page_size + j % page_size`.
    """


@kernel_op(validate=_vd.check_sparse_mla_with_kvcache, reference=ref.dsv4_sparse_mla_with_kvcache,
           npu=reference_on_device("dsv4_attention", "gathers and dequantizes the selected records"))
def dsv4_sparse_mla_with_kvcache(out, q, window_cache_2d, window_slots, window_block_size: int, compressed_cache_2d,
                                 compressed_slots, compressed_block_size: int, attn_sink, scale: float) -> None:
    """`flash_mla_with_kvcache_cpu`: sparse MQA of each token over its window and compressed cache entries, in place.

    q float `[num_tokens, num_heads, head_dim]` (nope + 64 rope dims), out `[num_tokens, num_heads, head_dim]` (any
    float dtype); window_slots int `[num_tokens, num_window >= 1]` into window_cache_2d (fp8_ds_mla,
    window_block_size records per row), compressed_slots int `[num_tokens, num_compressed >= 0]` into
    compressed_cache_2d (compressed_block_size; unused when num_compressed is 0). Either cache may instead hold plain
    rows in a float dtype (DeepSeek V4.1's model-dtype caches): a `[rows, >= block_size * head_dim]` view, record
    `(slot // block_size, slot % block_size)`. A slot counts when in [0, rows * block_size). Logits `scale * q .
    k_j` over the dequantized records (nope fp8 * scale | rope), float32 softmax that also counts attn_sink float
    `[num_heads]` as one more logit with a zero value; out = `sum_j w_j k_j` (the full record is the value). A token
    with no valid slot gets zeros.
    """


@kernel_op(validate=_vd.check_inverse_rope_o_proj, reference=ref.dsv4_inverse_rope_o_proj,
           npu=reference_on_device("dsv4_attention", "elementwise"))
def dsv4_inverse_rope_o_proj(o, positions, cos_sin_cache, rope_dim: int) -> torch.Tensor:
    """`inverse_gptj_rope_o_proj_cpu`: undo the query's GPT-J RoPE on the attention output.

    o float `[num_tokens, num_heads, head_dim]`, positions int `[num_tokens]`, cos_sin_cache float `[max_pos,
    rope_dim]`. Returns float32 (float64 for float64 o) `[num_tokens, num_heads, head_dim]`: the nope dims copied,
    the last rope_dim rotated by `-angle`. The `wo_a` projection that follows upstream (`bmm_cpu` over VNNI-packed
    weights) is a plain `torch.bmm` / matmul on the caller's side, not part of this op.
    """


# ------------------------------------------------------------------------- hyper-connections (mHC)


@kernel_op(validate=_vd.check_mhc_pre, reference=ref.dsv4_mhc_pre,
           npu=reference_on_device("dsv4_hyper", "one matmul, sigmoid/softmax and the Sinkhorn loop"))
def dsv4_mhc_pre(residual, fn, hc_scale, hc_base, rms_eps: float, hc_pre_eps: float, hc_sinkhorn_eps: float,
                 hc_post_mult_value: float, sinkhorn_repeat: int):
    """vLLM's `mhc_pre_torch` for any float dtype: the hyper-connection pre block.

    residual float `[..., hc, hidden]`, fn float `[(2 + hc) * hc, hc * hidden]`, hc_scale `[3]`, hc_base `[(2 + hc)
    * hc]`. mixes = `(flat @ fn.T) * rsqrt(mean(flat^2) + rms_eps)` over the flattened streams; pre =
    `sigmoid(mixes[:hc] * s0 + b) + hc_pre_eps`, post = `sigmoid(mixes[hc:2hc] * s1 + b) * hc_post_mult_value`, comb
    = softmax over the last dim of `mixes[2hc:] * s2 + b` (`[hc, hc]`) + hc_sinkhorn_eps, then column / row
    normalisations (sinkhorn_repeat rounds, the first a column one). Returns (post_mix float32 `[..., hc, 1]`,
    comb_mix float32 `[..., hc, hc]`, layer_input `sum_i pre_i * residual_i` `[..., hidden]` in residual's dtype);
    float64 inputs compute and return float64 mixes.
    """


@kernel_op(validate=_vd.check_mhc_post, reference=ref.dsv4_mhc_post,
           npu=reference_on_device("dsv4_hyper", "one einsum"))
def dsv4_mhc_post(x, residual, post_layer_mix, comb_res_mix):
    """vLLM's `mhc_post_torch` for any float dtype: out[j] = `sum_i comb[i, j] * residual[i] + post[j] * x`.

    x `[..., hidden]`, residual `[..., hc, hidden]`, post_layer_mix `[..., hc, 1]`, comb_res_mix `[..., hc, hc]`;
    returns `[..., hc, hidden]` in residual's dtype (float32 arithmetic, float64 for float64 residuals).
    """


@kernel_op(validate=_vd.check_hc_head, reference=ref.dsv4_hc_head,
           npu=reference_on_device("dsv4_hyper", "one matmul and a weighted sum"))
def dsv4_hc_head(hidden_states, hc_fn, hc_scale, hc_base, rms_norm_eps: float, hc_eps: float):
    """The hyper-connection head (transformers' DeepseekV4HyperHead; vLLM's `hc_head_fused_*`): streams -> one.

    hidden_states `[..., hc, hidden]`, hc_fn float `[hc, hc * hidden]`, hc_scale `[1]`, hc_base `[hc]`: flat =
    the streams flattened, mixes = `(flat * rsqrt(mean(flat^2) + rms_norm_eps)) @ hc_fn.T`, pre = `sigmoid(mixes *
    hc_scale + hc_base) + hc_eps`; returns `sum_i pre_i * hidden_states_i` `[..., hidden]` in hidden_states' dtype.
    """
