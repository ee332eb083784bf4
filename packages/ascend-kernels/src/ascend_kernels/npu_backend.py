"""The NPU backend: each facade op bound to its torch_npu kernel. The only module that imports torch_npu.

Each function here is the `impl` of an op's `NpuBinding` (declared with the op, `ascend_kernels.op_registry`);
selecting "npu" imports this module, and torch_npu is imported on the first call of any binding. Ops with no
dedicated torch_npu kernel (greedy, Gumbel and rejection sampling, logprobs, batch preparation, sparse MLA and most
of DeepSeek V4's) run the reference implementation on the NPU device ("torch" bindings). Paged caches are dense
(one contiguous [blocks, block_size, heads, dim] tensor per plane), except a hybrid model's attention planes, paged
beside its state pages, which `npu_paged_planes` brings to the kernels; where a kernel cannot take what it is given
(a non-contiguous MLA cache, a partial rotary, ...) the binding runs the reference and says so in `npu_usage`. A
call with no query rows (only padding: a PCP rank handed none of a step's tokens) launches no attention kernel.

Names and argument conventions follow vllm-ascend's use of torch_npu (attention_v1, mla_v1, ops/rotary_embedding,
layernorm, activation, fused_moe and sample/). Off an Ascend host they run over the testkit's schema-faithful
torch_npu (the wheel's own schemas and meta functions), which is how the tests hold them to torch_npu's signatures.
"""

from __future__ import annotations

import functools
import importlib

import torch

from ascend_kernels import npu_paged_planes, npu_usage, reference

_FIA_MASK_SIZE = 2048  # the compressed causal mask sparse_mode 3 expects
_SPARSE_CAUSAL, _SPARSE_BAND = 3, 4
_TOP_K_MAX = 1024  # npu_top_k_top_p takes k in [1, 1024]
_GATING_MAX_EXPERTS = 2048  # npu_moe_gating_top_k: at most 2048 experts, groups of more than 2


@functools.cache
def _torch_npu():
    return importlib.import_module("torch_npu")


def load_torch_npu() -> None:
    """Import torch_npu now: the registry calls this when the npu backend is selected, so that a binding traced into
    a compiled graph (vLLM compiles the model around its attention op) finds it imported (see `_npu`), and its
    fallbacks are counted when traced."""
    _torch_npu()
    npu_usage.count_traced_fallbacks()


class _CountedTorchNpu:
    """torch_npu as the bindings call it (`_npu().npu_rms_norm(...)`, `_npu().atb.npu_paged_cache_load(...)`):
    each call is recorded in npu_usage under the op's own name; the call sites stay plain torch_npu calls, which the
    contract checker (`ascend-vllm contracts check --torch-npu`) reads against the wheel's schemas."""

    def __init__(self, module) -> None:
        self._module = module

    def __getattr__(self, name: str):
        target = getattr(self._module, name)
        if name == "atb":
            return _CountedTorchNpu(target)

        def counted(*args, **kwargs):
            npu_usage.record_call(name)
            return target(*args, **kwargs)

        return counted


def _npu():
    if torch.compiler.is_compiling():
        # Traced into a compiled graph: the torch_npu ops go into it as they are (a graph replay runs no Python, so
        # there is no per-call count to keep). Neither the counting wrapper (a lock, a closure) nor the cached
        # importlib loader traces; an import of the module the backend's selection imported is a lookup there.
        import torch_npu

        return torch_npu
    return _CountedTorchNpu(_torch_npu())


@functools.cache
def _causal_mask(device_str: str) -> torch.Tensor:
    ones = torch.ones(_FIA_MASK_SIZE, _FIA_MASK_SIZE, dtype=torch.bool, device=device_str)
    return torch.triu(ones, diagonal=1)


def _dense(*caches: torch.Tensor) -> bool:
    """Whether every paged cache is one contiguous [blocks, block_size, heads, dim] tensor: torch_npu's paged caches
    do not take non-contiguous tensors, and `cache.view(nb, bs, -1)` is the [blocks, block_size, H] form they take."""
    return all(cache.is_contiguous() for cache in caches)


def _flat_blocks(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(cache.shape[0], cache.shape[1], -1)


def _not_dense(op: str, *caches: torch.Tensor) -> str:
    shapes = ", ".join(f"{tuple(c.shape)} strides {c.stride()}" for c in caches if not c.is_contiguous())
    return f"a paged cache is not contiguous ({shapes}); torch_npu's paged kernels take dense caches only"


def _kernel_slots(slot_mapping: torch.Tensor) -> torch.Tensor:
    """int32 slots for ATB's cache write, padding (-1) sent to slot 0. ATB documents no skip value (a negative slot
    is out of range), and dropping the padding would read the mask back to the host every layer; slot 0 is in vLLM's
    null block, which the block pool never hands to a request, so what lands there is never read as KV."""
    slots = slot_mapping.to(torch.int32)
    return torch.where(slots < 0, torch.zeros_like(slots), slots)


def reshape_and_cache(key, value, key_cache, value_cache, slot_mapping):
    if not _dense(key_cache, value_cache):  # a hybrid's paged planes: written in place by slot (npu_paged_planes)
        npu_usage.record_paged_planes("reshape_and_cache")
        return npu_paged_planes.write(key, value, key_cache, value_cache, _kernel_slots(slot_mapping))
    _npu()._npu_reshape_and_cache(key, value, key_cache, value_cache, _kernel_slots(slot_mapping))


def reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slot_mapping):
    if not _dense(latent_cache, rope_cache):
        npu_usage.record_fallback("reshape_and_cache_mla", _not_dense("reshape_and_cache_mla", latent_cache,
                                                                      rope_cache))
        return reference.reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slot_mapping)
    latent = latent.reshape(latent.shape[0], 1, latent.shape[-1])
    rope = rope.reshape(rope.shape[0], 1, rope.shape[-1])
    _npu()._npu_reshape_and_cache(latent, rope, latent_cache, rope_cache, _kernel_slots(slot_mapping))


def _host(values: list[int] | None, tensor: torch.Tensor) -> list[int]:
    """The caller's host list (built once per step), else one read-back of the tensor."""
    return list(values) if values is not None else tensor.tolist()


def _copy_rows(result: torch.Tensor, num_q: int, rows: int, heads: int, dim: int, out: torch.Tensor | None,
               like: torch.Tensor) -> torch.Tensor:
    """The kernel's [num_q, heads, dim] rows into `out` (or a new [rows, heads, dim]); padding rows are zero (all of
    them when no kernel ran: `num_q` 0, `result` None)."""
    if out is None:
        out = like.new_zeros(rows, heads, dim)
    else:
        out[num_q:].zero_()
    if num_q:
        out[:num_q].copy_(result.view(num_q, heads, -1))
    return out


def paged_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, scale, causal=True,
                    sliding_window=None, sinks=None, out=None, query_start_loc_host=None, seq_lens_host=None):
    # The kernel takes lengths at launch: the caller's host lists (built once per step), else one read-back each.
    starts = _host(query_start_loc_host, query_start_loc)
    num_q = starts[-1]
    if not num_q:  # only padding rows (a PCP rank handed none of the step's tokens): nothing to launch
        return _copy_rows(None, 0, query.shape[0], query.shape[1], value_cache.shape[3], out, query)
    lens = _host(seq_lens_host, seq_lens)
    masking = (causal, sliding_window, sinks)
    if not _dense(key_cache, value_cache):
        return _paged_planes_attention(query, key_cache, value_cache, block_table, starts, lens, scale, masking, out)
    result = _fia(query[:num_q], key_cache, value_cache, block_table.to(torch.int32), starts, lens, scale, masking)
    return _copy_rows(result, num_q, query.shape[0], query.shape[1], value_cache.shape[3], out, query)


def _fia(query, key_cache, value_cache, block_table, starts, lens, scale, masking):
    """One FIA call over `query`'s rows (`starts`: cumulative query lengths from 0, one entry per request more;
    `masking`: the op's (causal, sliding_window, sinks))."""
    causal, sliding_window, sinks = masking
    _, bs, hkv, _ = key_cache.shape
    kwargs = {}
    if causal:
        kwargs.update(atten_mask=_causal_mask(str(query.device)), sparse_mode=_SPARSE_CAUSAL)
    if sliding_window is not None:
        kwargs.update(atten_mask=_causal_mask(str(query.device)), sparse_mode=_SPARSE_BAND,
                      pre_tokens=sliding_window - 1, next_tokens=0 if causal else 2**31 - 1)
    if sinks is not None:
        kwargs["learnable_sink"] = sinks
    # FIA takes dense q/k/v: a query split from vLLM's fused qkv projection is a strided view.
    result, _ = _npu().npu_fused_infer_attention_score_v2(
        query.contiguous(), _flat_blocks(key_cache), _flat_blocks(value_cache),
        num_query_heads=query.shape[1], num_key_value_heads=hkv, input_layout="TND", softmax_scale=scale,
        block_table=block_table, block_size=bs, actual_seq_qlen=list(starts[1:]), actual_seq_kvlen=list(lens),
        **kwargs)
    return result


def _paged_planes_attention(query, key_cache, value_cache, block_table, starts, lens, scale, masking, out):
    """Attention over a hybrid's paged planes: FIA on dense copies of the blocks each piece of requests reads
    (`npu_paged_planes`), each piece's rows stored as they come."""
    npu_usage.record_paged_planes("paged_attention")
    _, bs, hkv, d = key_cache.shape
    heads, dv = query.shape[1], value_cache.shape[3]
    out = _copy_rows(None, 0, query.shape[0], heads, dv, out, query)  # zeroed; the pieces fill the real rows
    block_bytes = bs * hkv * (d + dv) * key_cache.element_size()
    for r0, r1 in npu_paged_planes.request_pieces(lens, bs, block_bytes):
        q0, q1 = starts[r0], starts[r1]
        if q1 == q0:
            continue
        k, v, table = npu_paged_planes.gather(key_cache, value_cache, block_table, r0, r1,
                                              -(-max(lens[r0:r1]) // bs))
        result = _fia(query[q0:q1], k, v, table, [s - q0 for s in starts[r0:r1 + 1]], lens[r0:r1], scale, masking)
        out[q0:q1].copy_(result.view(q1 - q0, heads, -1))
    return out


def mla_decode_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, seq_lens, *, scale, out=None,
                         seq_lens_host=None):
    if not _dense(latent_cache, rope_cache):
        npu_usage.record_fallback("mla_decode_attention", _not_dense("mla_decode_attention", latent_cache,
                                                                     rope_cache))
        return reference.mla_decode_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table,
                                              seq_lens, scale=scale, out=out, seq_lens_host=seq_lens_host)
    b, h, r = q_nope_absorbed.shape
    latent = _flat_blocks(latent_cache)
    result, _ = _npu().npu_fused_infer_attention_score(
        q_nope_absorbed.contiguous().view(b, h, 1, r), latent, latent,
        query_rope=q_rope.contiguous().view(b, h, 1, -1), key_rope=_flat_blocks(rope_cache), num_heads=h,
        num_key_value_heads=1, input_layout="BNSD", scale=scale, block_table=block_table.to(torch.int32),
        block_size=latent_cache.shape[1], actual_seq_lengths_kv=_host(seq_lens_host, seq_lens))
    result = result.view(b, h, r)
    if out is None:
        return result
    out.copy_(result)
    return out


def gather_mla_cache(latent_cache, rope_cache, block_table, seq_lens, *, seq_lens_host=None):
    if not _dense(latent_cache, rope_cache):
        npu_usage.record_fallback("gather_mla_cache", _not_dense("gather_mla_cache", latent_cache, rope_cache))
        return reference.gather_mla_cache(latent_cache, rope_cache, block_table, seq_lens, seq_lens_host=seq_lens_host)
    # The out= form (key/value given) sizes the rows from the host lengths: the kernel reads no length back.
    total = sum(seq_lens_host) if seq_lens_host is not None else int(seq_lens.sum())
    latent = latent_cache.new_empty(total, latent_cache.shape[3])
    rope = rope_cache.new_empty(total, rope_cache.shape[3])
    _npu().atb.npu_paged_cache_load(latent_cache, rope_cache, block_table.to(torch.int32),
            seq_lens.to(torch.int32), seq_starts=torch.zeros_like(seq_lens, dtype=torch.int32),
            key=latent.view(total, 1, -1), value=rope.view(total, 1, -1))
    return latent, rope


def mla_prefill_attention(q, k_nope, k_rope, v, query_start_loc, kv_start_loc, *, scale, out=None,
                          query_start_loc_host=None, kv_start_loc_host=None):
    t, h, _ = q.shape
    n = k_nope.shape[0]
    k = torch.cat([k_nope, k_rope.reshape(n, 1, -1).expand(n, h, -1)], dim=-1)
    starts = _host(query_start_loc_host, query_start_loc)
    num_q = starts[-1]
    if not num_q:  # only padding rows: nothing to launch
        return _copy_rows(None, 0, t, h, v.shape[2], out, q)
    result, _ = _npu().npu_fused_infer_attention_score(
        q[:num_q].contiguous(), k, v.contiguous(), num_heads=h, num_key_value_heads=h, input_layout="TND",
        scale=scale, atten_mask=_causal_mask(str(q.device)), sparse_mode=_SPARSE_CAUSAL,
        actual_seq_lengths=starts[1:], actual_seq_lengths_kv=_host(kv_start_loc_host, kv_start_loc)[1:])
    return _copy_rows(result, num_q, t, h, v.shape[2], out, q)


def rotary_embedding(positions, query, key, cos_sin_cache, *, head_size, rotary_dim, is_neox):
    reason = None
    if rotary_dim != head_size:
        reason = f"partial rotary (rotary_dim {rotary_dim} < head_size {head_size}): the ATB rope rotates whole heads"
    if reason is not None:
        npu_usage.record_fallback("rotary_embedding", reason)
        return reference.rotary_embedding(
            positions, query, key, cos_sin_cache, head_size=head_size, rotary_dim=rotary_dim, is_neox=is_neox)
    t = positions.shape[0]
    # The ATB rope rotates dense [tokens, heads*dim] rows in place; q/k split from a fused qkv projection are strided
    # views, rotated as dense copies and written back.
    # (A contiguous q or k is rotated in place: `.contiguous()` returns it. Strides, not data pointers, decide, which
    # a trace into a compiled graph can follow.)
    q2 = query.contiguous().view(t, -1)
    k2 = key.contiguous().view(t, -1) if key is not None else torch.empty_like(q2)
    _npu()._npu_rotary_embedding(positions, q2, k2, head_size, cos_sin_cache.to(query.dtype), is_neox)
    if not query.is_contiguous():
        query.copy_(q2.view(query.shape))
    if key is not None and not key.is_contiguous():
        key.copy_(k2.view(key.shape))
    return query, key


def rms_norm(x, weight, eps, residual=None):
    if residual is None:
        return _npu().npu_rms_norm(x, weight, eps)[0]
    out, _, new_residual = _npu().npu_add_rms_norm(x, residual, weight, eps)
    return out, new_residual


def silu_and_mul(x):
    return _npu().npu_swiglu(x, dim=-1)


def _gating_refusal(experts: int, topk: int, groups: int, topk_group: int, scoring_func: str) -> str | None:
    if scoring_func not in ("softmax", "sigmoid"):
        return f"scoring_func {scoring_func!r}: the kernel's norm_type covers softmax and sigmoid only"
    if experts > _GATING_MAX_EXPERTS or experts % groups or experts // groups <= 2:
        return f"{experts} experts in {groups} groups: the kernel takes at most 2048 experts in groups of more than 2"
    if topk > experts // groups * topk_group:
        return f"top-{topk} from {topk_group} of {groups} groups of {experts // groups} experts"
    return None


def moe_gating_topk(router_logits, topk, *, scoring_func="softmax", renormalize=True, num_expert_group=None,
                    topk_group=None, e_score_correction_bias=None, routed_scaling_factor=1.0):
    grouped = num_expert_group is not None and num_expert_group > 1
    groups, keep = (num_expert_group, topk_group) if grouped else (1, 1)
    reason = _gating_refusal(router_logits.shape[-1], topk, groups, keep, scoring_func)
    if reason is not None:
        npu_usage.record_fallback("moe_gating_topk", reason)
        return reference.moe_gating_topk(router_logits, topk, scoring_func=scoring_func, renormalize=renormalize,
                                         num_expert_group=num_expert_group, topk_group=topk_group,
                                         e_score_correction_bias=e_score_correction_bias,
                                         routed_scaling_factor=routed_scaling_factor)
    sigmoid = scoring_func == "sigmoid"
    bias = None if e_score_correction_bias is None else e_score_correction_bias.to(router_logits.dtype)
    # Sigmoid weights come back renormalised (y / (sum + eps)); unrenormalised ones are read from norm_out.
    want_scores = sigmoid and not renormalize
    weights, ids, scores = _npu().npu_moe_gating_top_k(
        router_logits, topk, bias=bias, k_group=keep, group_count=groups,
        group_select_mode=1 if bias is not None else 0, renorm=0, norm_type=1 if sigmoid else 0,
        out_flag=want_scores, routed_scaling_factor=1.0, eps=1e-20)
    weights = scores.gather(1, ids.long()) if want_scores else weights.float()
    if renormalize and not sigmoid:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)


def _gmm_bias(bias: torch.Tensor | None, dtype: torch.dtype) -> list[torch.Tensor] | None:
    # The grouped matmul takes a float32 bias for bfloat16 inputs and the input's dtype otherwise.
    if bias is None:
        return None
    return [bias.to(torch.float32 if dtype == torch.bfloat16 else dtype)]


def fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, w13_bias=None, w2_bias=None, swiglu_limit=None):
    if swiglu_limit is not None:
        npu_usage.record_fallback("fused_moe", "swiglu_limit (a clamped SwiGLU): npu_swiglu has no clamp")
        return reference.fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias=w13_bias,
                                   w2_bias=w2_bias, swiglu_limit=swiglu_limit)
    t, k = topk_ids.shape
    num_experts = w13.shape[0]
    if t == 0:
        return hidden_states.new_zeros(hidden_states.shape)
    dtype = hidden_states.dtype
    # Pairs whose expert lies outside [0, num_experts) (ids of -1 for experts on other ranks) are left out by the
    # active range: their row index is -1 and the expanded rows past the routed ones are undefined.
    expanded_x, row_idx, expert_tokens, _ = _npu().npu_moe_init_routing_v2(
        hidden_states, topk_ids.to(torch.int32), active_num=t * k, expert_num=num_experts,
        expert_tokens_num_type=1, expert_tokens_num_flag=True, active_expert_range=[0, num_experts])
    gate_up = _npu().npu_grouped_matmul([expanded_x], [w13.transpose(1, 2)], bias=_gmm_bias(w13_bias, dtype),
                      split_item=2, group_list_type=1, group_type=0, group_list=expert_tokens)[0]
    down = _npu().npu_grouped_matmul([_npu().npu_swiglu(gate_up)], [w2.transpose(1, 2)],
                   bias=_gmm_bias(w2_bias, dtype), split_item=2, group_list_type=1, group_type=0,
                   group_list=expert_tokens)[0]
    routed = torch.arange(down.shape[0], device=down.device) < expert_tokens.sum()
    down = torch.where(routed[:, None], down, torch.zeros((), dtype=down.dtype, device=down.device))
    valid = row_idx >= 0
    probs = torch.where(valid.view(t, k), topk_weights.to(dtype), torch.zeros((), dtype=dtype, device=down.device))
    return _npu().npu_moe_token_unpermute(down, row_idx.clamp(min=0), probs=probs)


def top_k_top_p(logits, top_k=None, top_p=None):
    if top_k is None and top_p is None:
        return logits
    rows, vocab = logits.shape
    k = None
    if top_k is not None:
        disabled = (top_k <= 0) | (top_k >= vocab)
        k = torch.where(disabled, torch.full_like(top_k, vocab), top_k).to(torch.int32)
        if vocab > _TOP_K_MAX and rows and int(k.max()) > _TOP_K_MAX:
            if bool(disabled.all()):
                k = None  # no row filters by top-k: the kernel's p-only form
            else:
                npu_usage.record_fallback("top_k_top_p", f"a top_k above {_TOP_K_MAX} (or disabled in some rows of "
                                          f"a {vocab}-token vocabulary): npu_top_k_top_p takes k in [1, {_TOP_K_MAX}]")
                return reference.top_k_top_p(logits, top_k, top_p)
    if k is None and top_p is None:
        return logits
    p = None if top_p is None else top_p.to(logits.dtype)
    return _npu().npu_top_k_top_p(logits, p, k)


def _full_lse(lse: torch.Tensor | None, num_q: int, rows: int, heads: int, device) -> torch.Tensor:
    full = torch.full((rows, heads), float("-inf"), dtype=torch.float32, device=device)
    if num_q:
        full[:num_q] = lse.reshape(num_q, heads).float()
    return full


def attention_with_lse(q, k, v, query_start_loc, kv_start_loc, *, scale, causal=True, out=None,
                       query_start_loc_host=None, kv_start_loc_host=None):
    t, h, _ = q.shape
    starts = _host(query_start_loc_host, query_start_loc)
    num_q = starts[-1]
    if not num_q:  # only padding rows: nothing to launch (output 0, lse -inf)
        return _copy_rows(None, 0, t, h, v.shape[2], out, q), _full_lse(None, 0, t, h, q.device)
    kwargs = {"atten_mask": _causal_mask(str(q.device)), "sparse_mode": _SPARSE_CAUSAL} if causal else {}
    # FIA without pages takes dense q/k/v: under PCP the query is split from the fused qkv projection and the keys
    # and values are halves of the all-gathered K|V rows (`gather_kv_rows`), all strided views.
    result, lse = _npu().npu_fused_infer_attention_score(
        q[:num_q].contiguous(), k.contiguous(), v.contiguous(), num_heads=h, num_key_value_heads=k.shape[1],
        input_layout="TND", scale=scale, softmax_lse_flag=True, actual_seq_lengths=starts[1:],
        actual_seq_lengths_kv=_host(kv_start_loc_host, kv_start_loc)[1:], **kwargs)
    return _copy_rows(result, num_q, t, h, v.shape[2], out, q), _full_lse(lse, num_q, t, h, q.device)


def paged_attention_with_lse(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, *, scale,
                             causal=True, out=None, query_start_loc_host=None, seq_lens_host=None):
    if not _dense(key_cache, value_cache):
        npu_usage.record_fallback("paged_attention_with_lse", _not_dense("paged_attention_with_lse", key_cache,
                                                                         value_cache))
        return reference.paged_attention_with_lse(query, key_cache, value_cache, block_table, query_start_loc,
                                                  seq_lens, scale=scale, causal=causal, out=out,
                                                  query_start_loc_host=query_start_loc_host,
                                                  seq_lens_host=seq_lens_host)
    t, h, _ = query.shape
    _, bs, hkv, _ = key_cache.shape
    starts = _host(query_start_loc_host, query_start_loc)
    num_q = starts[-1]
    if not num_q:  # only padding rows: nothing to launch (output 0, lse -inf)
        return (_copy_rows(None, 0, t, h, value_cache.shape[3], out, query),
                _full_lse(None, 0, t, h, query.device))
    kwargs = {"atten_mask": _causal_mask(str(query.device)), "sparse_mode": _SPARSE_CAUSAL} if causal else {}
    # FIA takes a dense query: under PCP it is split from the fused qkv projection (a strided view).
    result, lse = _npu().npu_fused_infer_attention_score(
        query[:num_q].contiguous(), _flat_blocks(key_cache), _flat_blocks(value_cache),
        num_heads=h, num_key_value_heads=hkv, input_layout="TND", scale=scale, softmax_lse_flag=True,
        block_table=block_table.to(torch.int32), block_size=bs, actual_seq_lengths=starts[1:],
        actual_seq_lengths_kv=_host(seq_lens_host, seq_lens), **kwargs)
    return _copy_rows(result, num_q, t, h, value_cache.shape[3], out, query), _full_lse(lse, num_q, t, h, query.device)


def merge_attention_states(outputs, lses, *, out=None):
    t, h, d = outputs[0].shape
    merged, _ = _npu().npu_attention_update([lse.float().reshape(t * h) for lse in lses],
                        [o.float().reshape(t * h, d) for o in outputs], 0)
    total = torch.logsumexp(torch.stack([lse.float() for lse in lses]), dim=0)
    merged = merged.view(t, h, d)
    if out is None:
        return merged.to(outputs[0].dtype), total
    out.copy_(merged)
    return out, total


def __getattr__(name: str):
    # NPU_BINDINGS is derived from the op declarations (`ascend_kernels.op_registry`), kept here for its readers.
    if name == "NPU_BINDINGS":
        from ascend_kernels.op_registry import npu_bindings

        return npu_bindings()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
