"""Argument checks the facade runs before dispatching: rank, shape, dtype and device, never tensor contents.

Reading tensor data would force a device sync, so only metadata is checked; each check costs a few attribute reads
(the benchmark `benchmarks/kernels.py` measures the total against a decode step). A failed check raises ValueError
naming the op, the argument, what it got and what was expected. `set_validation(False)` (or the environment variable
ASCEND_KERNELS_VALIDATE=0 at import) switches the checks off for hot paths.
"""

from __future__ import annotations

import os
from numbers import Real

import torch

_INDEX_DTYPES = frozenset({torch.int32, torch.int64})


class _Switch:
    enabled: bool = os.environ.get("ASCEND_KERNELS_VALIDATE", "1") != "0"


SWITCH = _Switch()


def set_validation(enabled: bool) -> None:
    """Turn the facade's argument checks on (default) or off, process-wide (rebinds every op: with checks off an
    op is the backend's function itself)."""
    SWITCH.enabled = bool(enabled)
    from ascend_kernels import registry

    registry.rebind()


def validation_enabled() -> bool:
    return SWITCH.enabled


def _describe(value: object) -> str:
    if isinstance(value, torch.Tensor):
        return f"shape {tuple(value.shape)}, dtype {value.dtype}, device {value.device}"
    return f"a {type(value).__name__} ({value!r})"


def fail(op: str, name: str, value: object, expected: str) -> None:
    raise ValueError(f"{op}: argument '{name}' has {_describe(value)}; expected {expected}")


def tensor(op: str, name: str, t: object, ndim: int, expected: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim:
        fail(op, name, t, expected)


def floating(op: str, name: str, t: torch.Tensor, expected: str) -> None:
    if not t.is_floating_point():
        fail(op, name, t, f"{expected} with a floating-point dtype")


def index(op: str, name: str, t: object, ndim: int, expected: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dim() != ndim or t.dtype not in _INDEX_DTYPES:
        fail(op, name, t, f"{expected} of dtype int32 or int64")


def same_device(op: str, name: str, t: torch.Tensor, device: torch.device, expected: str) -> None:
    if t.device != device:
        fail(op, name, t, f"{expected} on device {device}")


def same_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype, expected: str) -> None:
    if t.dtype != dtype:
        fail(op, name, t, f"{expected} of dtype {dtype}")


def number(op: str, name: str, value: object, expected: str, *, positive: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, Real) or (positive and not value > 0):
        fail(op, name, value, expected)


# ----------------------------------------------------------------------------------------------- per-op checks


def start_offsets(op: str, name: str, t: object, rows: int | None, dev: torch.device, what: str = "num_rows") -> None:
    """A `[rows + 1]` integer tensor of start offsets (`what` names the rows in the message) on `dev`."""
    expected = f"[{rows + 1}]" if rows is not None else f"[{what} + 1]"
    index(op, name, t, 1, expected)
    if rows is not None and t.shape[0] != rows + 1:
        fail(op, name, t, f"{expected} ({what} + 1) of dtype int32 or int64")
    same_device(op, name, t, dev, expected)


def host_lengths(op: str, name: str, value: object, length: int) -> None:
    """None, or a host list of `length` Python ints (lengths the caller already has on the host)."""
    if value is None:
        return
    if not isinstance(value, (list, tuple)) or len(value) != length or \
            not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        fail(op, name, value, f"None or a host list of {length} ints")


def check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping) -> None:
    op = "reshape_and_cache"
    tensor(op, "key", key, 3, "[num_tokens, num_kv_heads, head_size]")
    n, h, d = key.shape
    dev = key.device
    tensor(op, "value", value, 3, f"[{n}, {h}, head_size_v]")
    if value.shape[0] != n or value.shape[1] != h:
        fail(op, "value", value, f"[{n}, {h}, head_size_v]")
    tensor(op, "key_cache", key_cache, 4, f"[num_blocks, block_size, {h}, {d}]")
    if key_cache.shape[2] != h or key_cache.shape[3] != d:
        fail(op, "key_cache", key_cache, f"[num_blocks, block_size, {h}, {d}]")
    expected_v = f"[{key_cache.shape[0]}, {key_cache.shape[1]}, {h}, {value.shape[2]}]"
    tensor(op, "value_cache", value_cache, 4, expected_v)
    if value_cache.shape[:3] != key_cache.shape[:3] or value_cache.shape[3] != value.shape[2]:
        fail(op, "value_cache", value_cache, expected_v)
    index(op, "slot_mapping", slot_mapping, 1, f"[{n}]")
    if slot_mapping.shape[0] != n:
        fail(op, "slot_mapping", slot_mapping, f"[{n}] of dtype int32 or int64")
    for name, t in (("value", value), ("key_cache", key_cache), ("value_cache", value_cache)):
        same_device(op, name, t, dev, "a tensor")
    same_device(op, "slot_mapping", slot_mapping, dev, "a tensor")


def check_reshape_and_cache_mla(latent, rope, latent_cache, rope_cache, slot_mapping) -> None:
    op = "reshape_and_cache_mla"
    if not isinstance(latent, torch.Tensor) or latent.dim() not in (2, 3) or latent.dim() == 3 and latent.shape[1] != 1:
        fail(op, "latent", latent, "[num_tokens, kv_lora_rank] or [num_tokens, 1, kv_lora_rank]")
    n, r = latent.shape[0], latent.shape[-1]
    if (
        not isinstance(rope, torch.Tensor)
        or rope.dim() != latent.dim()
        or rope.shape[0] != n
        or (rope.dim() == 3 and rope.shape[1] != 1)
    ):
        fail(op, "rope", rope, f"[{n}, rope_dim]" + (" or [n, 1, rope_dim]" if latent.dim() == 3 else ""))
    tensor(op, "latent_cache", latent_cache, 4, f"[num_blocks, block_size, 1, {r}]")
    if latent_cache.shape[2] != 1 or latent_cache.shape[3] != r:
        fail(op, "latent_cache", latent_cache, f"[num_blocks, block_size, 1, {r}]")
    expected_rope = f"[{latent_cache.shape[0]}, {latent_cache.shape[1]}, 1, {rope.shape[-1]}]"
    tensor(op, "rope_cache", rope_cache, 4, expected_rope)
    if rope_cache.shape[:3] != latent_cache.shape[:3] or rope_cache.shape[3] != rope.shape[-1]:
        fail(op, "rope_cache", rope_cache, expected_rope)
    index(op, "slot_mapping", slot_mapping, 1, f"[{n}]")
    if slot_mapping.shape[0] != n:
        fail(op, "slot_mapping", slot_mapping, f"[{n}] of dtype int32 or int64")
    dev = latent.device
    for name, t in (("rope", rope), ("latent_cache", latent_cache), ("rope_cache", rope_cache)):
        same_device(op, name, t, dev, "a tensor")
    same_device(op, "slot_mapping", slot_mapping, dev, "a tensor")


def check_paged_attention(
    query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale, sliding_window, sinks, out
) -> None:
    op = "paged_attention"
    tensor(op, "query", query, 3, "[num_tokens, num_heads, head_size]")
    floating(op, "query", query, "[num_tokens, num_heads, head_size]")
    t, hq, d = query.shape
    dev, dtype = query.device, query.dtype
    tensor(op, "key_cache", key_cache, 4, f"[num_blocks, block_size, num_kv_heads, {d}]")
    nb, bs, hkv, dk = key_cache.shape
    if dk != d or hkv == 0 or hq % hkv:
        fail(op, "key_cache", key_cache, f"[num_blocks, block_size, num_kv_heads dividing {hq}, {d}]")
    same_dtype(op, "key_cache", key_cache, dtype, "a cache")
    same_device(op, "key_cache", key_cache, dev, "a cache")
    expected_v = f"[{nb}, {bs}, {hkv}, head_size_v]"
    tensor(op, "value_cache", value_cache, 4, expected_v)
    if value_cache.shape[:3] != key_cache.shape[:3]:
        fail(op, "value_cache", value_cache, expected_v)
    same_dtype(op, "value_cache", value_cache, dtype, expected_v)
    same_device(op, "value_cache", value_cache, dev, expected_v)
    index(op, "block_table", block_table, 2, "[num_reqs, max_blocks_per_req]")
    same_device(op, "block_table", block_table, dev, "[num_reqs, max_blocks_per_req]")
    r = block_table.shape[0]
    index(op, "query_start_loc", query_start_loc, 1, f"[{r + 1}]")
    if query_start_loc.shape[0] != r + 1:
        fail(op, "query_start_loc", query_start_loc, f"[{r + 1}] (num_reqs + 1) of dtype int32 or int64")
    same_device(op, "query_start_loc", query_start_loc, dev, f"[{r + 1}]")
    index(op, "seq_lens", seq_lens, 1, f"[{r}]")
    if seq_lens.shape[0] != r:
        fail(op, "seq_lens", seq_lens, f"[{r}] (num_reqs) of dtype int32 or int64")
    same_device(op, "seq_lens", seq_lens, dev, f"[{r}]")
    number(op, "scale", scale, "a positive real number", positive=True)
    if sliding_window is not None and (
        isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window <= 0
    ):
        fail(op, "sliding_window", sliding_window, "None or a positive int")
    if sinks is not None:
        tensor(op, "sinks", sinks, 1, f"[{hq}]")
        if sinks.shape[0] != hq:
            fail(op, "sinks", sinks, f"[{hq}] (one logit per query head)")
        same_device(op, "sinks", sinks, dev, f"[{hq}]")
    if out is not None:
        expected_out = f"[{t}, {hq}, {value_cache.shape[3]}]"
        if not isinstance(out, torch.Tensor) or out.shape != (t, hq, value_cache.shape[3]):
            fail(op, "out", out, expected_out)
        same_dtype(op, "out", out, dtype, expected_out)
        same_device(op, "out", out, dev, expected_out)


def check_mla_decode_attention(q_nope_absorbed, q_rope, latent_cache, rope_cache, block_table, seq_lens, scale,
                               out) -> None:
    op = "mla_decode_attention"
    tensor(op, "q_nope_absorbed", q_nope_absorbed, 3, "[num_reqs, num_heads, kv_lora_rank]")
    floating(op, "q_nope_absorbed", q_nope_absorbed, "[num_reqs, num_heads, kv_lora_rank]")
    b, h, r = q_nope_absorbed.shape
    dev, dtype = q_nope_absorbed.device, q_nope_absorbed.dtype
    tensor(op, "q_rope", q_rope, 3, f"[{b}, {h}, rope_dim]")
    if q_rope.shape[:2] != q_nope_absorbed.shape[:2]:
        fail(op, "q_rope", q_rope, f"[{b}, {h}, rope_dim]")
    rd = q_rope.shape[2]
    for name, t, last in (("latent_cache", latent_cache, r), ("rope_cache", rope_cache, rd)):
        expected = f"[num_blocks, block_size, 1, {last}]"
        tensor(op, name, t, 4, expected)
        if t.shape[2] != 1 or t.shape[3] != last or t.shape[:2] != latent_cache.shape[:2]:
            fail(op, name, t, expected)
        same_dtype(op, name, t, dtype, expected)
        same_device(op, name, t, dev, expected)
    same_dtype(op, "q_rope", q_rope, dtype, f"[{b}, {h}, {rd}]")
    same_device(op, "q_rope", q_rope, dev, f"[{b}, {h}, {rd}]")
    index(op, "block_table", block_table, 2, f"[{b}, max_blocks_per_req]")
    if block_table.shape[0] != b:
        fail(op, "block_table", block_table, f"[{b}, max_blocks_per_req] of dtype int32 or int64")
    same_device(op, "block_table", block_table, dev, f"[{b}, max_blocks_per_req]")
    index(op, "seq_lens", seq_lens, 1, f"[{b}]")
    if seq_lens.shape[0] != b:
        fail(op, "seq_lens", seq_lens, f"[{b}] of dtype int32 or int64")
    same_device(op, "seq_lens", seq_lens, dev, f"[{b}]")
    number(op, "scale", scale, "a positive real number", positive=True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (b, h, r) or out.dtype != dtype):
        fail(op, "out", out, f"[{b}, {h}, {r}] of dtype {dtype}")


def check_rotary_embedding(positions, query, key, cos_sin_cache, head_size, rotary_dim) -> None:
    op = "rotary_embedding"
    index(op, "positions", positions, 1, "[num_tokens]")
    t = positions.shape[0]
    if not isinstance(head_size, int) or head_size <= 0:
        fail(op, "head_size", head_size, "a positive int")
    if not isinstance(rotary_dim, int) or not 0 < rotary_dim <= head_size or rotary_dim % 2:
        fail(op, "rotary_dim", rotary_dim, f"an even int in (0, {head_size}]")
    for name, x in (("query", query), ("key", key)):
        if x is None and name == "key":
            continue
        expected = f"[{t}, num_heads * {head_size}] or [{t}, num_heads, {head_size}]"
        if not isinstance(x, torch.Tensor) or x.dim() not in (2, 3) or x.shape[0] != t or not x.is_floating_point():
            fail(op, name, x, expected)
        if (x.dim() == 3 and x.shape[2] != head_size) or (x.dim() == 2 and x.shape[1] % head_size):
            fail(op, name, x, expected)
        same_device(op, name, x, positions.device, expected)
    tensor(op, "cos_sin_cache", cos_sin_cache, 2, f"[max_position, {rotary_dim}] (cos half then sin half)")
    if cos_sin_cache.shape[1] != rotary_dim or not cos_sin_cache.is_floating_point():
        fail(op, "cos_sin_cache", cos_sin_cache, f"[max_position, {rotary_dim}] floating (cos half then sin half)")
    same_device(op, "cos_sin_cache", cos_sin_cache, positions.device, f"[max_position, {rotary_dim}]")


def check_rms_norm(x, weight, eps, residual) -> None:
    op = "rms_norm"
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or not x.is_floating_point():
        fail(op, "x", x, "[..., hidden_size] floating")
    hidden = x.shape[-1]
    tensor(op, "weight", weight, 1, f"[{hidden}]")
    if weight.shape[0] != hidden:
        fail(op, "weight", weight, f"[{hidden}]")
    same_device(op, "weight", weight, x.device, f"[{hidden}]")
    number(op, "eps", eps, "a positive real number", positive=True)
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.shape != x.shape:
            fail(op, "residual", residual, f"None or {list(x.shape)} like x")
        same_device(op, "residual", residual, x.device, f"{list(x.shape)}")


def check_silu_and_mul(x) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.shape[-1] % 2 or not x.is_floating_point():
        fail("silu_and_mul", "x", x, "[..., 2 * d] floating (gate half, then up half)")


def check_moe_gating_topk(router_logits, topk, scoring_func, renormalize, num_expert_group, topk_group,
                          e_score_correction_bias, routed_scaling_factor) -> None:
    op = "moe_gating_topk"
    tensor(op, "router_logits", router_logits, 2, "[num_tokens, num_experts]")
    floating(op, "router_logits", router_logits, "[num_tokens, num_experts]")
    experts = router_logits.shape[1]
    if scoring_func not in ("softmax", "sigmoid", "sqrtsoftplus"):
        fail(op, "scoring_func", scoring_func, "'softmax', 'sigmoid' or 'sqrtsoftplus'")
    if not isinstance(renormalize, bool):
        fail(op, "renormalize", renormalize, "a bool")
    number(op, "routed_scaling_factor", routed_scaling_factor, "a positive real number", positive=True)
    selectable = experts
    if num_expert_group is not None and num_expert_group > 1:
        if isinstance(num_expert_group, bool) or not isinstance(num_expert_group, int) or experts % num_expert_group:
            fail(op, "num_expert_group", num_expert_group, f"an int dividing num_experts ({experts})")
        if (isinstance(topk_group, bool) or not isinstance(topk_group, int)
                or not 0 < topk_group <= num_expert_group):
            fail(op, "topk_group", topk_group, f"an int in [1, {num_expert_group}] (the groups kept)")
        per_group = experts // num_expert_group
        if e_score_correction_bias is not None and per_group < 2:
            fail(op, "num_expert_group", num_expert_group, "groups of at least 2 experts with a correction bias")
        selectable = topk_group * per_group
    if isinstance(topk, bool) or not isinstance(topk, int) or not 0 < topk <= selectable:
        fail(op, "topk", topk, f"an int in [1, {selectable}] (the experts selectable)")
    if e_score_correction_bias is not None:
        tensor(op, "e_score_correction_bias", e_score_correction_bias, 1, f"None or [{experts}]")
        floating(op, "e_score_correction_bias", e_score_correction_bias, f"[{experts}]")
        if e_score_correction_bias.shape[0] != experts:
            fail(op, "e_score_correction_bias", e_score_correction_bias, f"None or [{experts}]")
        same_device(op, "e_score_correction_bias", e_score_correction_bias, router_logits.device, f"[{experts}]")


def check_fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, *, op: str = "fused_moe",
                    w13_bias=None, w2_bias=None) -> None:
    tensor(op, "hidden_states", hidden_states, 2, "[num_tokens, hidden_size]")
    floating(op, "hidden_states", hidden_states, "[num_tokens, hidden_size]")
    t, hidden = hidden_states.shape
    dev = hidden_states.device
    tensor(op, "w13", w13, 3, f"[num_experts, 2 * intermediate, {hidden}]")
    e, two_i, _ = w13.shape
    if w13.shape[2] != hidden or two_i % 2:
        fail(op, "w13", w13, f"[num_experts, 2 * intermediate, {hidden}]")
    tensor(op, "w2", w2, 3, f"[{e}, {hidden}, {two_i // 2}]")
    if w2.shape != (e, hidden, two_i // 2):
        fail(op, "w2", w2, f"[{e}, {hidden}, {two_i // 2}]")
    tensor(op, "topk_weights", topk_weights, 2, f"[{t}, topk]")
    if topk_weights.shape[0] != t:
        fail(op, "topk_weights", topk_weights, f"[{t}, topk]")
    index(op, "topk_ids", topk_ids, 2, f"{list(topk_weights.shape)}")
    if topk_ids.shape != topk_weights.shape:
        fail(op, "topk_ids", topk_ids, f"{list(topk_weights.shape)} of dtype int32 or int64")
    for name, x in (("w13", w13), ("w2", w2), ("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        same_device(op, name, x, dev, "a tensor")
    for name, bias, shape in (("w13_bias", w13_bias, (e, two_i)), ("w2_bias", w2_bias, (e, hidden))):
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != shape
                                 or bias.device != dev):
            fail(op, name, bias, f"None or {list(shape)} on device {dev}")


def _logits(op: str, name: str, logits) -> None:
    tensor(op, name, logits, 2, "[num_reqs, vocab_size]")
    floating(op, name, logits, "[num_reqs, vocab_size]")


def _per_request(op: str, name: str, value, b: int, device, *, integer: bool, optional: bool) -> None:
    if value is None and optional:
        return
    if not integer and isinstance(value, Real) and not isinstance(value, bool):
        return
    kind = "int32/int64" if integer else "floating"
    expected = f"{'None or ' if optional else ''}[{b}] {kind}" + ("" if integer else " (or a real number)")
    if not isinstance(value, torch.Tensor) or value.shape != (b,) or value.device != device:
        fail(op, name, value, expected + f" on device {device}")
    if (value.dtype not in _INDEX_DTYPES) if integer else (not value.is_floating_point()):
        fail(op, name, value, expected)


def check_top_k_top_p(logits, top_k, top_p) -> None:
    op = "top_k_top_p"
    _logits(op, "logits", logits)
    b, dev = logits.shape[0], logits.device
    _per_request(op, "top_k", top_k, b, dev, integer=True, optional=True)
    if top_p is not None and not isinstance(top_p, torch.Tensor):
        fail(op, "top_p", top_p, f"None or [{b}] floating on device {dev}")
    _per_request(op, "top_p", top_p, b, dev, integer=False, optional=True)


def check_rejection_sample(
    draft_token_ids, draft_probs, target_logits, bonus_token_ids, temperature, top_k, top_p, generator
) -> None:
    op = "rejection_sample"
    index(op, "draft_token_ids", draft_token_ids, 2, "[num_reqs, max_spec_len]")
    b, k = draft_token_ids.shape
    dev = draft_token_ids.device
    tensor(op, "target_logits", target_logits, 3, f"[{b}, {k}, vocab_size]")
    if target_logits.shape[:2] != (b, k) or not target_logits.is_floating_point():
        fail(op, "target_logits", target_logits, f"[{b}, {k}, vocab_size] floating")
    same_device(op, "target_logits", target_logits, dev, f"[{b}, {k}, vocab_size]")
    v = target_logits.shape[2]
    if draft_probs is not None:
        if not isinstance(draft_probs, torch.Tensor) or draft_probs.shape != (b, k, v):
            fail(op, "draft_probs", draft_probs, f"None or [{b}, {k}, {v}] floating")
        floating(op, "draft_probs", draft_probs, f"[{b}, {k}, {v}]")
        same_device(op, "draft_probs", draft_probs, dev, f"[{b}, {k}, {v}]")
    if (
        not isinstance(bonus_token_ids, torch.Tensor)
        or bonus_token_ids.dtype not in _INDEX_DTYPES
        or bonus_token_ids.shape not in ((b,), (b, 1))
    ):
        fail(op, "bonus_token_ids", bonus_token_ids, f"[{b}] or [{b}, 1] of dtype int32 or int64")
    same_device(op, "bonus_token_ids", bonus_token_ids, dev, f"[{b}]")
    _per_request(op, "temperature", temperature, b, dev, integer=False, optional=True)
    _per_request(op, "top_k", top_k, b, dev, integer=True, optional=True)
    _per_request(op, "top_p", top_p, b, dev, integer=False, optional=True)
    if generator is not None and not isinstance(generator, torch.Generator):
        fail(op, "generator", generator, "None or a torch.Generator")


def check_compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size, out) -> None:
    op = "compute_slot_mapping"
    index(op, "block_table", block_table, 2, "[num_rows, max_blocks_per_req]")
    dev = block_table.device
    index(op, "req_indices", req_indices, 1, "[num_reqs]")
    r = req_indices.shape[0]
    index(op, "query_start_loc", query_start_loc, 1, f"[{r + 1}]")
    if query_start_loc.shape[0] < r + 1:
        fail(op, "query_start_loc", query_start_loc, f"at least [{r + 1}] (num_reqs + 1) of dtype int32 or int64")
    index(op, "positions", positions, 1, "[num_tokens]")
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        fail(op, "block_size", block_size, "a positive int")
    if not isinstance(out, torch.Tensor) or out.dim() != 1 or out.dtype != torch.int64:
        fail(op, "out", out, "[max_tokens] of dtype int64")
    for name, t in (("req_indices", req_indices), ("query_start_loc", query_start_loc), ("positions", positions),
                    ("out", out)):
        same_device(op, name, t, dev, "a tensor")


def check_gumbel_sample(logits, temperature, seeds, positions, fp64) -> None:
    op = "gumbel_sample"
    _logits(op, "logits", logits)
    b, dev = logits.shape[0], logits.device
    if not isinstance(temperature, torch.Tensor) or temperature.shape != (b,) or not temperature.is_floating_point():
        fail(op, "temperature", temperature, f"[{b}] floating")
    index(op, "seeds", seeds, 1, f"[{b}]")
    index(op, "positions", positions, 1, f"[{b}]")
    for name, t in (("temperature", temperature), ("seeds", seeds), ("positions", positions)):
        if t.shape != (b,):
            fail(op, name, t, f"[{b}]")
        same_device(op, name, t, dev, f"[{b}]")
    if not isinstance(fp64, bool):
        fail(op, "fp64", fp64, "a bool")


def check_gather_logprobs(logits, token_ids) -> None:
    op = "gather_logprobs"
    _logits(op, "logits", logits)
    b = logits.shape[0]
    index(op, "token_ids", token_ids, 2, f"[{b}, k]")
    if token_ids.shape[0] != b:
        fail(op, "token_ids", token_ids, f"[{b}, k] of dtype int32 or int64")
    same_device(op, "token_ids", token_ids, logits.device, f"[{b}, k]")


def check_token_ranks(logits, token_ids) -> None:
    op = "token_ranks"
    _logits(op, "logits", logits)
    b = logits.shape[0]
    index(op, "token_ids", token_ids, 1, f"[{b}]")
    if token_ids.shape[0] != b:
        fail(op, "token_ids", token_ids, f"[{b}] of dtype int32 or int64")
    same_device(op, "token_ids", token_ids, logits.device, f"[{b}]")


def check_sample_greedy(logits) -> None:
    _logits("sample_greedy", "logits", logits)


def check_routed_fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, swiglu_limit) -> None:
    check_fused_moe(hidden_states, w13, w2, topk_weights, topk_ids, op="fused_moe", w13_bias=w13_bias, w2_bias=w2_bias)
    if swiglu_limit is not None:
        number("fused_moe", "swiglu_limit", swiglu_limit, "None or a positive real number", positive=True)
