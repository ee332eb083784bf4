"""The kernel facade: each op declared once (`@kernel_op`, `ascend_kernels.op_registry`), its contract in the docstring.

`from ascend_kernels import ops`. A declaration names the op's argument check (`ascend_kernels.validation*`, called
with the op's own arguments; switchable) and what runs it on each backend; selecting a backend binds `ops.<name>` to
that backend's function (checks off) or to a wrapper that checks and then calls it (checks on). The other op modules
(`OP_MODULES`) are re-exported here. Conventions shared by every op:
- KV caches are 4-D `[num_blocks, block_size, num_kv_heads, head_size]` per layer, K and V separate. MLA: latent
  cache `[num_blocks, block_size, 1, kv_lora_rank]` and rope cache `[num_blocks, block_size, 1, rope_dim]`. The
  allocator hands every served layer dense caches (the device layout torch_npu's kernels take); the reference
  backend also honours strided views, the NPU backend falls back to it for them and counts it.
- A slot is `block_id * block_size + offset`; slot -1 marks a padding token and is skipped.
- A request's `seq_len` counts its whole context including the tokens scheduled now, so its `q_len` queries sit at
  positions `seq_len - q_len ... seq_len - 1`.
- Attention ops take their length tensors also as optional host lists (`seq_lens_host`, `query_start_loc_host`,
  `kv_start_loc_host`), which the caller builds once per step: a device kernel that takes lengths at launch then
  never reads them back per layer. They must equal the tensors (not checked: that would read the device).
"""

from __future__ import annotations

import importlib

import torch

from ascend_kernels import reference as ref
from ascend_kernels import validation as _v
from ascend_kernels import validation_cp as _vcp
from ascend_kernels import validation_mla as _vm
from ascend_kernels import validation_sfa as _vs
from ascend_kernels.op_registry import NpuBinding, kernel_op, reference_on_device


@kernel_op(validate=_v.check_reshape_and_cache, reference=ref.reshape_and_cache,
           npu=NpuBinding(target="torch_npu._npu_reshape_and_cache", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:reshape_and_cache",
                          note="slots as int32, padding to the null block's slot 0; dense caches"))
def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    """Write each token's K/V into its cache slot, in place.

    key `[num_tokens, num_kv_heads, head_size]`, value `[num_tokens, num_kv_heads, head_size_v]`;
    key_cache/value_cache `[num_blocks, block_size, num_kv_heads, head_size(_v)]` (strided views allowed);
    slot_mapping int64 (int32 accepted) `[num_tokens]`, token i goes to block `slot // block_size`, row
    `slot % block_size`; slot -1 = padding, written into no request's block (the reference skips it; the NPU
    binding sends it to slot 0, in vLLM's null block, which is never handed to a request, so no host sync is needed
    to drop it). Values are cast to the cache dtype.
    """


@kernel_op(validate=_v.check_reshape_and_cache_mla, reference=ref.reshape_and_cache_mla,
           npu=NpuBinding(target="torch_npu._npu_reshape_and_cache", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:reshape_and_cache_mla", note="latent as key, rope as "
                               "value"))
def reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slot_mapping) -> None:
    """MLA's cache write: latent `[num_tokens, kv_lora_rank]` and rope `[num_tokens, rope_dim]` (or both with a
    middle dim of 1) into latent_cache `[num_blocks, block_size, 1, kv_lora_rank]` and rope_cache
    `[num_blocks, block_size, 1, rope_dim]`; slots as in `reshape_and_cache` (-1: no request's block). In place."""


@kernel_op(validate=_v.check_paged_attention, reference=ref.paged_attention,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score_v2", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:paged_attention", note="TND query, paged KV [blocks, "
                               "block_size, heads*dim]; sparse_mode 3 (causal) with a 2048x2048 mask, pre_tokens = "
                               "window - 1 for sliding windows, learnable_sink for sinks"))
def paged_attention(
    query,
    key_cache,
    value_cache,
    block_table,
    query_start_loc,
    seq_lens,
    *,
    scale: float,
    causal: bool = True,
    sliding_window: int | None = None,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    query_start_loc_host: list[int] | None = None,
    seq_lens_host: list[int] | None = None,
) -> torch.Tensor:
    """Attention of a mixed prefill/decode batch over paged K/V caches (the new tokens' K/V already written).

    query `[num_tokens, num_heads, head_size]`: request r owns rows `query_start_loc[r] : query_start_loc[r+1]`
    (int32 `[num_reqs + 1]`, non-decreasing, starting at 0); rows past `query_start_loc[-1]` are padding and come out
    as zeros. seq_lens int32 `[num_reqs]`: context length of each request including its new tokens, so query row i
    of a request with q_len rows sits at position `p = seq_len - q_len + i`. block_table int32
    `[num_reqs, max_blocks]`: logical block j of request r is physical block `block_table[r, j]` (entries past the
    context are ignored). Caches: `[num_blocks, block_size, num_kv_heads, head_size]` and `[..., head_size_v]`,
    num_heads a multiple of num_kv_heads (GQA/MQA; query head h reads kv head `h // (num_heads // num_kv_heads)`).

    A query at position p sees key positions j < seq_len with j <= p when `causal` (all j < seq_len otherwise) and
    j > p - sliding_window when a window is given (vLLM's semantics: the window includes p itself). Logits are
    `scale * q.k`; softmax in float32. `sinks` (float `[num_heads]`, gpt-oss style): per-head logits that join each
    row's softmax denominator only, i.e. weights `exp(s_j) / (sum_j exp(s_j) + exp(sink_h))`.
    Returns `[num_tokens, num_heads, head_size_v]` in query's dtype (written into `out` when given).

    `query_start_loc_host` / `seq_lens_host`: the same values as host lists of ints, when the caller has them (built
    once per step): a kernel that takes lengths at launch then never reads them back from the device. They must
    equal the tensors (not checked: that would read the device).
    """


@kernel_op(validate=_v.check_mla_decode_attention, reference=ref.mla_decode_attention,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:mla_decode_attention", note="BNSD query with "
                               "query_rope/key_rope over the paged latent cache, one KV head"))
def mla_decode_attention(
    q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, seq_lens, *, scale: float, out=None,
    seq_lens_host: list[int] | None = None,
) -> torch.Tensor:
    """MLA decode (one query per request) over the latent cache, with W_UK already absorbed into the query.

    q_nope_absorbed `[num_reqs, num_heads, kv_lora_rank]`, q_rope `[num_reqs, num_heads, rope_dim]`; caches as in
    `reshape_and_cache_mla`; block_table `[num_reqs, max_blocks]`, seq_lens `[num_reqs]` (the query is the last
    position, so it sees every key j < seq_len). Logits `scale * (q_nope.latent_j + q_rope.rope_j)`, float32
    softmax; returns `sum_j w_j * latent_j` as `[num_reqs, num_heads, kv_lora_rank]` (W_UV is the caller's).
    """


@kernel_op(validate=_vm.check_gather_mla_cache, reference=ref.gather_mla_cache,
           npu=NpuBinding(target="torch_npu.atb.npu_paged_cache_load", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:gather_mla_cache", note="latent as key, rope as value; "
                               "seq_starts 0; the out= form sized from the host lengths; dense caches"))
def gather_mla_cache(latent_cache, rope_cache, block_table, seq_lens, *, seq_lens_host: list[int] | None = None):
    """Each request's whole context from the paged MLA cache, as contiguous rows (for prefill's up-projection).

    Caches as in `reshape_and_cache_mla`; block_table int `[num_reqs, max_blocks]`, seq_lens int `[num_reqs]`.
    Returns (latent `[sum(seq_lens), kv_lora_rank]`, rope `[sum(seq_lens), rope_dim]`) in the caches' dtype: request
    r's positions 0 .. seq_lens[r] - 1, requests one after the other.
    """


@kernel_op(validate=_vm.check_mla_prefill_attention, reference=ref.mla_prefill_attention,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:mla_prefill_attention", note="TND q/k/v with k = "
                               "[k_nope, k_rope per head], cumulative q/kv lengths, sparse_mode 3 (bottom-right "
                               "causal) with the 2048x2048 mask"))
def mla_prefill_attention(q, k_nope, k_rope, v, query_start_loc, kv_start_loc, *, scale: float, out=None,
                          query_start_loc_host: list[int] | None = None, kv_start_loc_host: list[int] | None = None):
    """MLA prefill attention with up-projected keys: every head's key is `[k_nope[j, h], k_rope[j]]`.

    q `[num_tokens, num_heads, qk_nope + rope_dim]`; k_nope `[num_kv, num_heads, qk_nope]`; k_rope `[num_kv,
    rope_dim]` (or `[num_kv, 1, rope_dim]`), shared by all heads; v `[num_kv, num_heads, v_head_dim]`. Request r owns
    query rows `query_start_loc[r] : [r+1]` (m rows) and key rows `kv_start_loc[r] : [r+1]` (n >= m rows, its whole
    context including the m new tokens), both int `[num_reqs + 1]`. Query i sits at position n - m + i and sees keys
    j <= n - m + i (a chunk continuing a context). Logits `scale * q.k`, float32 softmax; returns
    `[num_tokens, num_heads, v_head_dim]` in q's dtype (into `out` when given; rows past the last request zero).
    """


@kernel_op(validate=_v.check_rotary_embedding, reference=ref.rotary_embedding,
           npu=NpuBinding(target="torch_npu._npu_rotary_embedding", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:rotary_embedding", note="in place on [tokens, "
                               "heads*rotary_dim]"))
def rotary_embedding(positions, query, key, cos_sin_cache, *, head_size: int, rotary_dim: int, is_neox: bool):
    """Rotary position embedding applied IN PLACE to query and key (like vLLM's op); returns (query, key).

    positions int64 `[num_tokens]`; query `[num_tokens, num_heads * head_size]` or `[num_tokens, num_heads,
    head_size]`, key likewise with its own head count (or None); cos_sin_cache `[max_position, rotary_dim]`, row p
    = cos(p * inv_freq) then sin(p * inv_freq) (rotary_dim // 2 each). Only the first `rotary_dim` dims of each head
    rotate (partial rotary). NeoX style pairs dim i with i + rotary_dim // 2; GPT-J style pairs 2i with 2i + 1.
    """


@kernel_op(validate=_v.check_rms_norm, reference=ref.rms_norm,
           npu=NpuBinding(target="torch_npu.npu_rms_norm / torch_npu.npu_add_rms_norm", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:rms_norm"))
def rms_norm(x, weight, eps: float, residual=None):
    """RMSNorm over the last dim, computed in float32: `x / sqrt(mean(x^2) + eps) * weight`, in x's dtype.

    With `residual` (same shape as x): first `h = x + residual` (float32), returns `(rms_norm(h), h in residual's
    dtype)`, the fused residual add of vLLM's `fused_add_rms_norm`. Inputs are not modified.
    """


@kernel_op(validate=_v.check_silu_and_mul, reference=ref.silu_and_mul,
           npu=NpuBinding(target="torch_npu.npu_swiglu", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:silu_and_mul"))
def silu_and_mul(x) -> torch.Tensor:
    """`x [..., 2d]` -> `silu(x[..., :d]) * x[..., d:]` of shape `[..., d]` (gate half first, as vLLM)."""


@kernel_op(validate=_v.check_moe_gating_topk, reference=ref.moe_gating_topk,
           npu=NpuBinding(target="torch_npu.npu_moe_gating_top_k", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:moe_gating_topk", note="norm_type 0/1 = "
                               "softmax/sigmoid, group_select_mode 1 (top-2 sum) with a bias, 0 (max) without; "
                               "renormalisation and routed_scaling_factor applied after the kernel; sqrtsoftplus "
                               "(DeepSeek V4) runs the reference"))
def moe_gating_topk(router_logits, topk: int, *, scoring_func: str = "softmax", renormalize: bool = True,
                    num_expert_group: int | None = None, topk_group: int | None = None,
                    e_score_correction_bias=None, routed_scaling_factor: float = 1.0):
    """MoE routing of the Qwen3 / DeepSeek families: scores, optional biased and grouped selection, top-k.

    router_logits `[num_tokens, num_experts]` -> (weights float32 `[num_tokens, topk]`, expert ids int32
    `[num_tokens, topk]`), ordered by descending selection score. In float32:
    1. scores = softmax(logits) over experts (`scoring_func="softmax"`), sigmoid(logits) (`"sigmoid"`) or
       sqrt(softplus(logits)) (`"sqrtsoftplus"`, DeepSeek V4).
    2. Selection scores = scores + e_score_correction_bias (float `[num_experts]`, DeepSeek-V3's noaux_tc) when
       given, else the scores.
    3. Grouped (num_expert_group > 1; num_experts divisible by it): a group's score is the sum of its two best
       selection scores with a bias, its best one without; only the topk_group best groups stay selectable.
    4. ids = the topk best selection scores; weights = the *unbiased* scores at those ids.
    5. With `renormalize` the k weights are divided by their sum; then multiplied by routed_scaling_factor.
    """


@kernel_op(validate=_v.check_routed_fused_moe, reference=ref.fused_moe,
           npu=NpuBinding(target="torch_npu.npu_moe_init_routing_v2 + npu_grouped_matmul + npu_swiglu + "
                                 "npu_moe_token_unpermute", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:fused_moe",
                          note="ids outside [0, num_experts) dropped by active_expert_range; count-mode group list; "
                               "a swiglu_limit (DeepSeek V4) runs the reference"))
def fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, w13_bias=None, w2_bias=None,
              swiglu_limit: float | None = None) -> torch.Tensor:
    """Routed experts (SiLU-gated MLPs) over a token batch; a (token, slot) pair with a negative id is skipped.

    hidden_states `[num_tokens, hidden]`; w13 `[num_experts, 2 * intermediate, hidden]` (gate rows then up rows);
    w2 `[num_experts, hidden, intermediate]`; optional w13_bias `[num_experts, 2 * intermediate]`, w2_bias
    `[num_experts, hidden]`; topk_weights float `[num_tokens, k]`; topk_ids int `[num_tokens, k]`, each in
    [-1, num_experts): the caller maps routed experts to its own weight rows and marks experts held elsewhere
    (expert parallelism) with -1.
    out[t] = sum over i with e = topk_ids[t, i] >= 0 of topk_weights[t, i] * (w2[e] @ silu_and_mul(w13[e] @ x[t] +
    b13[e]) + b2[e]); float32 accumulation, result in hidden_states' dtype (a token with no pair is all zeros).
    swiglu_limit L (DeepSeek V4; None or > 0): the activation is `silu(min(gate, L)) * clamp(up, -L, L)`.
    """


@kernel_op(validate=_v.check_sample_greedy, reference=ref.sample_greedy,
           npu=NpuBinding(target="torch.argmax on the NPU device", kind="torch"))
def sample_greedy(logits) -> torch.Tensor:
    """Argmax token per row of logits `[num_reqs, vocab]` -> int64 `[num_reqs]` (lowest id on ties)."""


@kernel_op(validate=_v.check_top_k_top_p, reference=ref.top_k_top_p,
           npu=NpuBinding(target="torch_npu.npu_top_k_top_p", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:top_k_top_p",
                          note="the fused filter for top_k and/or top_p; a top_k above 1024 runs the reference"))
def top_k_top_p(logits, top_k=None, top_p=None) -> torch.Tensor:
    """The sampling filter: logits `[num_reqs, vocab]` (floating) with each row's tokens outside its top_k, then
    outside its top_p, set to -inf -> the filtered logits (same shape and dtype; may be `logits` itself).

    top_k int `[num_reqs]`: <= 0 or >= vocab disables a row's limit; ties at the k-th logit are kept. top_p float
    `[num_reqs]`: the smallest set of most likely tokens (after top_k) whose mass reaches p, at least one; 1.0
    disables. None disables either filter. The draw itself is the caller's (vLLM's samplers keep their own noise).
    """


@kernel_op(validate=_v.check_rejection_sample, reference=ref.rejection_sample,
           npu=reference_on_device("rejection"))
def rejection_sample(
    draft_token_ids,
    draft_probs,
    target_logits,
    bonus_token_ids,
    *,
    temperature=None,
    top_k=None,
    top_p=None,
    generator: torch.Generator | None = None,
    target_is_probs: bool = False,
):
    """Speculative-decoding rejection sampler (strict and lossless): returns (output_token_ids, num_accepted).

    Inputs, for num_reqs requests with up to K draft tokens each:
    - draft_token_ids int `[num_reqs, K]`: request r's drafts are its leading entries >= 0; the rest are -1
      padding (a request may have 0 drafts).
    - draft_probs float `[num_reqs, K, vocab]`: the distribution each draft token was sampled from, or None for a
      deterministic drafter (probability 1 on the drafted token).
    - target_logits float `[num_reqs, K, vocab]`: the target model's logits at each draft position (row k scores the
      token that follows drafts 0..k-1); rows past a request's drafts are ignored. With `target_is_probs=True` these
      are final probabilities instead and temperature/top_k/top_p are not applied to them (temperature then only
      selects greedy rows).
    - bonus_token_ids int `[num_reqs]` or `[num_reqs, 1]`: the token the caller sampled from the target at the
      position after the request's last draft (the argmax there for greedy rows); used only when every draft of the
      request is accepted.
    - temperature float `[num_reqs]` or None (None = every row greedy), top_k / top_p as in `sample`: the target
      distribution p at each position is softmax(logits / T) filtered by top-k then top-p, exactly as `sample`.

    Per request, positions k = 0, 1, ... in order: the draft token x is accepted with probability
    min(1, p(x) / q(x)) (q = draft_probs, or 1 for a deterministic drafter; accepted when u * q(x) < p(x) with
    u ~ U[0, 1)). At the first rejection a token is drawn from the residual max(p - q, 0) renormalised (from p if
    the residual is all zero) and the request stops. If all its drafts are accepted, bonus_token_ids[r] follows.
    Greedy rows (temperature < 1e-5 or None) use p = one-hot(argmax of the target logits): a draft is accepted iff
    it equals the argmax and the replacement token is the argmax. The output tokens are thus distributed exactly as
    sampling the target token by token.

    Returns output_token_ids int64 `[num_reqs, K + 1]`: request r's `num_accepted[r] + 1` tokens (accepted drafts,
    then the recovered or bonus token) followed by -1 padding; and num_accepted int64 `[num_reqs]` (accepted draft
    tokens, 0..number of drafts). Randomness from `generator` when given.
    """


@kernel_op(validate=_v.check_compute_slot_mapping, reference=ref.compute_slot_mapping,
           npu=reference_on_device("batch_prep", "reads the token count back (one sync per step)"))
def compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size: int, *, out) -> torch.Tensor:
    """The KV cache slot of every scheduled token, from its request's block table; written into `out`.

    Batch row r owns tokens `query_start_loc[r] : query_start_loc[r+1]` (int `[num_reqs + 1]`, non-decreasing, from
    0) and reads block-table row `req_indices[r]` (int `[num_reqs]`; a negative index marks a dummy request whose
    tokens get slot -1). Token t at position p = positions[t] (int, at least `query_start_loc[-1]` entries) gets
    slot `block_table[req, p // block_size] * block_size + p % block_size` (block_table int `[rows, max_blocks]`).
    out int64 `[max_tokens]` (at least `query_start_loc[-1]` long): entries past the batch's tokens become -1.
    Returns out.
    """


@kernel_op(validate=_v.check_gumbel_sample, reference=ref.gumbel_sample,
           npu=reference_on_device("gumbel"))
def gumbel_sample(logits, temperature, seeds, positions, *, apply_temperature: bool = True,
                  fp64: bool = False) -> torch.Tensor:
    """One token per row of logits `[num_rows, vocab]` by Gumbel-max with counter-based noise -> int64 `[num_rows]`.

    temperature float `[num_rows]`: 0 makes the row greedy (argmax of the float32 logits, lowest id on ties);
    otherwise the row returns `argmax_j(l_j + g_j)` with `l = logits / temperature` (logits unchanged when
    `apply_temperature` is False: the caller scaled them) and g_j Gumbel noise that is a pure function of
    (seeds[r], positions[r], j) (int64 `[num_rows]` each): vLLM Model Runner V2's murmur3 stream, so a seeded request
    repeats exactly whatever else is in its batch. Noise and the argmax run in float64 when `fp64`.
    """


@kernel_op(validate=_v.check_gather_logprobs, reference=ref.gather_logprobs,
           npu=reference_on_device("logprobs"))
def gather_logprobs(logits, token_ids) -> torch.Tensor:
    """Log-probabilities `log_softmax(logits)[r, token_ids[r, i]]` in float32 -> `[num_rows, k]`.

    logits float `[num_rows, vocab]`, token_ids int `[num_rows, k]` (each in [0, vocab)); the softmax is over the whole
    row in float32 (max-shifted log-sum-exp), without materialising the `[num_rows, vocab]` log-probabilities.
    """


@kernel_op(validate=_v.check_token_ranks, reference=ref.token_ranks,
           npu=reference_on_device("logprobs"))
def token_ranks(logits, token_ids) -> torch.Tensor:
    """Rank of token_ids[r] (int `[num_rows]`) in its row of logits `[num_rows, vocab]` -> int64 `[num_rows]`:
    the number of entries whose logit is >= the token's (so the most likely token has rank 1, ties count)."""


# ------------------------------------------------------------------------- sparse attention (SFA, DeepSeek V3.2)


@kernel_op(validate=_vs.check_quantize_fp8_groups, reference=ref.quantize_fp8_groups,
           npu=reference_on_device("sparse_mla", "float8_e4m3fn casts on the device"))
def quantize_fp8_groups(x, *, group_size: int, pow2_scales: bool = True):
    """Per-group dynamic float8_e4m3fn quantization along the last dim (DeepSeek V3.2's indexer query).

    x float `[..., D]` with D a multiple of group_size. Per group: scale = max(amax, 1e-10) / 448, rounded up to a
    power of two when `pow2_scales` (ue8m0); values = clamp(x / scale, +-448) rounded to nearest float8_e4m3fn.
    Returns (values float8_e4m3fn `[..., D]`, scales float32 `[..., D // group_size]`).
    """


@kernel_op(validate=_vs.check_indexer_cache_write, reference=ref.indexer_cache_write,
           npu=reference_on_device("sparse_mla", "fp8 e4m3 + float32 scale per 128 elements, scattered by slot"))
def indexer_cache_write(k, k_cache, scale_cache, slot_mapping) -> None:
    """Write each token's lightning-indexer key into its slot of the indexer cache, fp8-quantized, in place.

    k float `[num_tokens, head_dim]` (head_dim a multiple of 128); k_cache float8_e4m3fn `[num_blocks, block_size,
    1, head_dim]` and scale_cache float32 `[num_blocks, block_size, 1, head_dim // 128]` (strided views allowed):
    value = k / scale per 128 elements with scale = 2^ceil(log2(amax / 448)). Slots as in `reshape_and_cache`
    (slot_mapping at least num_tokens long; -1 skipped).
    """


@kernel_op(validate=_vs.check_indexer_topk, reference=ref.indexer_topk,
           npu=reference_on_device("sparse_mla", "npu_lightning_indexer needs bf16 keys; one loop step per request"))
def indexer_topk(q, weights, k_cache, scale_cache, block_table, query_start_loc, seq_lens, *, topk: int,
                 query_start_loc_host: list[int] | None = None, seq_lens_host: list[int] | None = None) -> torch.Tensor:
    """The lightning indexer: each query token's `topk` best key positions in its own request.

    q `[num_tokens, index_heads, head_dim]` (any float dtype, float8 included; read as float32), weights float
    `[num_tokens, index_heads]`; caches as in `indexer_cache_write` (keys dequantized: fp8 value * scale); requests
    as in `paged_attention` (block_table `[num_reqs, max_blocks]`, query_start_loc `[num_reqs + 1]`, seq_lens
    `[num_reqs]`; query i of a request with m queries sits at position p = seq_len - m + i). Score of key position
    j <= p: `sum_h weights[t, h] * relu(q[t, h] . k_j)`. Returns int32 `[num_tokens, topk]`: the positions of the
    min(topk, p + 1) highest scores in descending position order, then -1 (rows of padding tokens are all -1).
    `query_start_loc_host` / `seq_lens_host`: the same lengths as host lists (see the module docstring).
    """


@kernel_op(validate=_vs.check_sparse_mla_attention, reference=ref.sparse_mla_attention,
           npu=reference_on_device("sparse_mla", "npu_sparse_flash_attention is not a torch_npu op; gathers the "
                                                 "selected latents by position"))
def sparse_mla_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, query_start_loc,
                         topk_positions, *, scale: float, out=None,
                         query_start_loc_host: list[int] | None = None) -> torch.Tensor:
    """MLA over each query's selected tokens only (decode and prefill alike, W_UK absorbed into the query).

    q_nope_absorbed `[num_tokens, num_heads, kv_lora_rank]`, q_rope `[num_tokens, num_heads, rope_dim]`; caches as in
    `reshape_and_cache_mla`; request r owns query rows `query_start_loc[r] : [r+1]` and reads block-table row r;
    topk_positions int `[>= num_tokens, K]`: the key positions (within the request) each query attends to, -1 for
    none. Logits `scale * (q_nope.latent_j + q_rope.rope_j)` over the selected j, float32 softmax; returns
    `sum_j w_j * latent_j` as `[num_tokens, num_heads, kv_lora_rank]` (rows past `query_start_loc[-1]` and rows
    that selected nothing are zeros; written into `out` when given). `query_start_loc_host`: the same offsets as a
    host list (see the module docstring).
    """


# ------------------------------------------------------------------------- context parallelism (PCP)


@kernel_op(validate=_vcp.check_attention_with_lse, reference=ref.attention_with_lse,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:attention_with_lse", note="TND q/k/v, cumulative q/kv "
                               "lengths, softmax_lse_flag; sparse_mode 3 (bottom-right causal) with the 2048x2048 "
                               "mask when causal"))
def attention_with_lse(q, k, v, query_start_loc, kv_start_loc, *, scale: float, causal: bool = True, out=None,
                       query_start_loc_host: list[int] | None = None, kv_start_loc_host: list[int] | None = None):
    """Attention over contiguous K/V rows that also returns each query row's log-sum-exp (one part of a merge).

    q `[num_tokens, num_heads, head_size]`; k `[num_kv, num_kv_heads, head_size]`, v `[num_kv, num_kv_heads,
    head_size_v]` (GQA: query head h reads KV head `h // (num_heads // num_kv_heads)`). Row r owns queries
    `query_start_loc[r] : [r+1]` (m of them) and keys `kv_start_loc[r] : [r+1]` (n), both int `[num_rows + 1]`.
    With `causal` the queries are the last m of the n positions (a chunk continuing a context): query i sees keys
    j <= n - m + i; otherwise it sees all n. Logits `scale * q.k`, softmax in float32 (float64 for float64 inputs).
    Returns (out `[num_tokens, num_heads, head_size_v]` in q's dtype, written into `out` when given; lse
    `[num_tokens, num_heads]` float32 (float64 for float64 inputs), natural log, -inf where a row saw no key, whose
    output is 0; rows past the last query are 0 / -inf).
    """


@kernel_op(validate=_vcp.check_paged_attention_with_lse, reference=ref.paged_attention_with_lse,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:paged_attention_with_lse", note="TND query over the "
                               "paged cache [blocks, block_size, heads*dim] with block_table, softmax_lse_flag"))
def paged_attention_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *,
                             scale: float, causal: bool = True, out=None, query_start_loc_host: list[int] | None = None,
                             seq_lens_host: list[int] | None = None):
    """`paged_attention`'s contract (no window, no sinks) that also returns the log-sum-exp, as `attention_with_lse`.

    Under PCP a chunk's cached context is one part: `seq_lens` = the tokens cached before this step and
    `causal=False` (every cached key precedes every query of the chunk). A row with seq_len 0 gives output 0 and
    lse -inf. Returns (out, lse).
    """


@kernel_op(validate=_vcp.check_merge_attention_states, reference=ref.merge_attention_states,
           npu=NpuBinding(target="torch_npu.npu_attention_update", kind="torch_npu",
                          impl="ascend_kernels.npu_backend:merge_attention_states", note="float32 [tokens*heads, "
                               "dim] outputs and [tokens*heads] lses, update_type 0; the merged lse by logsumexp"))
def merge_attention_states(outputs, lses, *, out=None):
    """Merge partial attention results by their log-sum-exps: the attention over the union of their keys.

    outputs: S tensors `[num_tokens, num_heads, head_size]` (one dtype); lses: S tensors `[num_tokens, num_heads]`
    float32/float64 (-inf: that part saw no key for the row). Returns (out = sum_s exp(lse_s - lse) * out_s in the
    outputs' dtype, written into `out` when given; lse = log sum_s exp(lse_s), float32 or float64 as
    `attention_with_lse`). A row no part saw a key in comes out 0 with lse -inf.
    """


@kernel_op(validate=_vcp.check_gather_kv_rows, reference=ref.gather_kv_rows,
           npu=NpuBinding(target="torch.index_select on the NPU device", kind="torch"))
def gather_kv_rows(packed_kv, index, *, key_size: int):
    """Select rows of the K|V all-gathered from every PCP rank and split them into keys and values.

    packed_kv `[num_gathered, num_kv_heads, key_size + value_size]`: each token's key then value along the last
    dim (one all-gather moves both); index int `[num_rows]`: which gathered rows, in order (e.g. each query chunk's
    keys in position order). Returns (keys `[num_rows, num_kv_heads, key_size]`, values `[num_rows, num_kv_heads,
    value_size]`), possibly strided views of one gathered copy.
    """


def _reexport_families() -> list[str]:
    """Every op of the other op modules (DeepSeek V4, V4.1, ...) is `ops.<name>` too; `__all__` is every op."""
    from ascend_kernels import op_registry

    names = list(op_registry.declarations())
    for name, decl in op_registry.declarations().items():
        if decl.module != __name__:
            globals()[name] = getattr(importlib.import_module(decl.module), name)
    return names


__all__ = _reexport_families()
