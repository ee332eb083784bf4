"""`AscendMoEMethod`: the unquantized MoE method of the Ascend platform (experts through `ascend_kernels`).

Registered out of tree for vLLM's `UnquantizedFusedMoEMethod`, so every routed-experts layer built here gets it
(vLLM picks the method inside `RoutedExperts.__init__`, for a model's own subclass too). On an out-of-tree platform
vLLM's method selects no kernel at all (its `is_monolithic` then fails on the first forward); this one is
monolithic, so vLLM's MoE runner hands the layer the router logits and the layer routes itself
(`AscendRoutedExpertsMixin.forward_monolithic`), then calls `apply_experts` here. Weights keep vLLM's layout
(`w13 [experts, 2 * intermediate, hidden]`, `w2 [experts, hidden, intermediate]`), `ascend_kernels.fused_moe`'s.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod

from ascend_platform.facade import kernel_ops


class AscendMoEMethod(UnquantizedFusedMoEMethod):
    @property
    def is_monolithic(self) -> bool:
        return True

    @property
    def supports_eplb(self) -> bool:
        return True

    def create_weights(self, layer: Any, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        from ascend_platform.moe.routed_experts import adopt

        if self.moe.activation != MoEActivation.SILU:
            raise NotImplementedError(f"{layer.layer_name}: Ascend MoE experts run SiLU-gated MLPs, not "
                                      f"{self.moe.activation.value!r}")
        super().create_weights(layer, num_experts, hidden_size, intermediate_size_per_partition, params_dtype,
                               **extra_weight_attrs)
        adopt(layer)

    def process_weights_after_loading(self, layer: Any) -> None:
        super().process_weights_after_loading(layer)
        layer.ascend_after_loading()

    def apply_experts(self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor,
                      local_ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum for each token (pairs with id -1 belong to other ranks)."""
        return kernel_ops().fused_moe(x, layer.w13_weight, layer.w2_weight, topk_weights, local_ids,
                                      w13_bias=getattr(layer, "w13_bias", None) if self.moe.has_bias else None,
                                      w2_bias=getattr(layer, "w2_bias", None) if self.moe.has_bias else None,
                                      **_swiglu_limit(self.moe))

    def apply_monolithic(self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        return layer.forward_monolithic(x, router_logits, input_ids)


def _swiglu_limit(moe: Any) -> dict[str, float]:
    """DeepSeek V4's experts clamp their gate and up projections (`swiglu_limit`); other models pass nothing."""
    limit = getattr(moe, "swiglu_limit", None)
    return {} if limit is None else {"swiglu_limit": float(limit)}
