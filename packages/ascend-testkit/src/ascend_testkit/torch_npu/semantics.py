"""Op name -> semantic implementation: this package's own, and the attention family from `attention/`."""

from __future__ import annotations

from collections.abc import Callable

from ascend_testkit.torch_npu import gated_delta, grouped_matmul, moe_routing, norms, quant, rotary, top_k_top_p

OWN: dict[str, Callable] = {
    "npu_rms_norm": norms.npu_rms_norm,
    "npu_add_rms_norm": norms.npu_add_rms_norm,
    "npu_swiglu": norms.npu_swiglu,
    "_npu_rotary_embedding": rotary._npu_rotary_embedding,
    "npu_moe_gating_top_k": moe_routing.npu_moe_gating_top_k,
    "npu_moe_init_routing_v2": moe_routing.npu_moe_init_routing_v2,
    "npu_grouped_matmul": grouped_matmul.npu_grouped_matmul,
    "npu_moe_token_unpermute": moe_routing.npu_moe_token_unpermute,
    "npu_top_k_top_p": top_k_top_p.npu_top_k_top_p,
    "npu_quantize": quant.npu_quantize,
    "npu_dynamic_quant": quant.npu_dynamic_quant,
    "npu_quant_matmul": quant.npu_quant_matmul,
    "npu_weight_quant_batchmatmul": quant.npu_weight_quant_batchmatmul,
    "npu_anti_quant": quant.npu_anti_quant,
    "npu_recurrent_gated_delta_rule": gated_delta.npu_recurrent_gated_delta_rule,
    "npu_chunk_gated_delta_rule": gated_delta.npu_chunk_gated_delta_rule,
}


LIMIT_PROFILES = ("card", "tiny-models")


def attention_implementations(profile: str = "card") -> dict[str, Callable]:
    """The attention family (`attention/`), under the card's documented size limits or the tiny-model profile."""
    from ascend_testkit.torch_npu import attention

    if profile not in LIMIT_PROFILES:
        raise ValueError(f"limits profile {profile!r} is not one of {LIMIT_PROFILES}")
    found = dict(attention.implementations(attention.CARD if profile == "card" else attention.TINY_MODELS))
    # attention/'s npu_paged_cache_load takes the out= overload's key/value too; the dispatcher binds that overload
    # (`npu_paged_cache_load.out`) separately, so it is served by the same function.
    if "npu_paged_cache_load" in found:
        found.setdefault("npu_paged_cache_load.out", found["npu_paged_cache_load"])
    return found


def all_implementations(profile: str = "card") -> dict[str, Callable]:
    attention = attention_implementations(profile)
    clash = sorted(set(attention) & set(OWN))
    if clash:
        raise RuntimeError(f"ops implemented twice (own and attention/): {clash}")
    return {**OWN, **attention}
