"""Expert routing of a routed-experts layer through `ascend_kernels`: the gating variants vLLM's models configure.

A routed-experts layer carries its model's routing choice as attributes (`top_k`, `renormalize`, `scoring_func`,
`use_grouped_topk`, `num_expert_group`, `topk_group`, `e_score_correction_bias`, `routed_scaling_factor`,
`custom_routing_function`); vLLM's own routers read the same attributes. Qwen3-MoE is softmax top-k with
renormalised weights; DeepSeek-V2 is grouped softmax; DeepSeek-V3 sigmoid with a correction bias (noaux_tc);
DeepSeek-V4 sqrt(softplus) with the correction bias.
"""

from __future__ import annotations

from typing import Any

import torch

from ascend_platform import usage
from ascend_platform.facade import kernel_ops

SCORING_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def check_routing(layer: Any) -> None:
    """Refuse, at construction, routing this module cannot reproduce (naming the layer and the setting)."""
    if layer.custom_routing_function is None and layer.scoring_func not in SCORING_FUNCS:
        raise NotImplementedError(f"{layer.layer_name}: Ascend MoE routing supports scoring_func "
                                  f"{SCORING_FUNCS}, not {layer.scoring_func!r}")
    if getattr(layer.moe_config, "has_hash_routing", False):
        raise NotImplementedError(f"{layer.layer_name}: hash routing (DeepSeek-V4) is not supported by Ascend MoE")


def route(layer: Any, hidden_states: torch.Tensor, router_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights float32 `[tokens, top_k]`, logical expert ids int32 `[tokens, top_k]`) for `layer`'s routing."""
    if layer.custom_routing_function is not None:
        usage.count("moe.routing.custom")
        weights, ids = layer.custom_routing_function(hidden_states=hidden_states, gating_output=router_logits,
                                                     topk=layer.top_k, renormalize=layer.renormalize)
        return weights.float(), ids.to(torch.int32)
    grouped = bool(layer.use_grouped_topk) and (layer.num_expert_group or 1) > 1
    return kernel_ops().moe_gating_topk(
        router_logits, layer.top_k, scoring_func=layer.scoring_func, renormalize=bool(layer.renormalize),
        num_expert_group=layer.num_expert_group if grouped else None,
        topk_group=layer.topk_group if grouped else None,
        e_score_correction_bias=layer.e_score_correction_bias,
        routed_scaling_factor=float(layer.routed_scaling_factor))
