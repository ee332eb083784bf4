"""Quantized routed experts: int8 (W8A8_DYNAMIC) and int4 (W4A8_DYNAMIC) expert weights with dynamic per-token int8
activations, run by `ascend_kernels.fused_moe_quant`.

Tensors per expert linear as the checkpoints write them (`<layer>.experts.<e>.{gate,up,down}_proj.<name>`, N output
rows, K inputs), which vLLM's expert loader gathers into `w13_<name>` (gate then up) and `w2_<name>`:
- ModelSlim W8A8_DYNAMIC: weight int8 [N, K]; weight_scale / weight_offset [N, 1] in the model dtype (the offset is
  zero: symmetric weights).
- ModelSlim W4A8_DYNAMIC (per-channel; vllm-ascend's reading of ModelSlim's format): weight int8 [N / 2, K], two int4
  values per byte along the output rows (row 2j in the low nibble, 2j + 1 in the high one); weight_scale /
  weight_offset float32 [N, 1]; scale_bias float32, [N, 1] for gate / up and [H, 16] for down (the down projection's
  K split in 16 partial sums, so a TP rank can sum its share): 8 x scale x the row's int4 sum, the term torch_npu's
  A8W4 grouped matmul takes as its bias. Per-group int4 (`group_size` > 0) is refused.
- compressed-tensors int8 W8A8 MoE (channel-wise symmetric weights, dynamic per-token activations): weight int8
  [N, K], weight_scale float32 [N, 1].
After loading the weights are transposed once to the kernels' `[E, K, N]` layout (int4: `[E, K, N / 2]`, still two
values per byte), scales become float32 `[E, N]` and the down projection's scale_bias is summed; nothing is
dequantized, so expert weights keep 1 byte (int8) or half a byte (int4) per parameter.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.routed_experts import FusedMoeWeightScaleSupported
from vllm.model_executor.utils import set_weight_attrs

from ascend_platform.facade import kernel_ops
from ascend_platform.quantization.errors import QuantizationRefusedError

# ModelSlim splits the down projection's scale_bias into this many partial sums over its inputs.
DOWN_SCALE_BIAS_PARTS = 16


def _register(layer: Any, name: str, data: torch.Tensor, attrs: dict, *, channel: bool = False) -> None:
    param = torch.nn.Parameter(data, requires_grad=False)
    layer.register_parameter(name, param)
    set_weight_attrs(param, attrs | ({"quant_method": FusedMoeWeightScaleSupported.CHANNEL.value} if channel else {}))


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


class AscendQuantMoEMethod(FusedMoEMethodBase):
    """Monolithic like `AscendMoEMethod`: vLLM's MoE runner hands the layer its router logits, the layer routes
    through `ascend_kernels` (`AscendRoutedExpertsMixin.forward_monolithic`) and calls `apply_experts` here."""

    quant_type = ""
    int4 = False
    scale_dtype: torch.dtype | None = None  # None: the model dtype
    has_offset = True

    def __init__(self, moe: Any, prefix: str) -> None:
        super().__init__(moe)
        self.prefix = prefix

    @property
    def is_monolithic(self) -> bool:
        return True

    @property
    def supports_eplb(self) -> bool:
        return False  # EPLB moves w13 / w2 only; the scales would stay behind

    def get_fused_moe_quant_config(self, layer: Any) -> None:
        return None  # no vLLM modular kernel runs these experts

    def create_weights(self, layer: Any, num_experts: int, hidden_size: int, intermediate_size_per_partition: int,
                       params_dtype: torch.dtype, **extra_weight_attrs: Any) -> None:
        from ascend_platform.moe.routed_experts import adopt

        if self.moe.activation != MoEActivation.SILU:
            raise QuantizationRefusedError(f"{self.prefix}: quantized Ascend MoE experts run SiLU-gated MLPs, not "
                                           f"{self.moe.activation.value!r}")
        if self.moe.has_bias:
            raise QuantizationRefusedError(f"{self.prefix}: quantized experts with biases are not supported")
        inter, pack = intermediate_size_per_partition, 2 if self.int4 else 1
        attrs = {k: v for k, v in extra_weight_attrs.items() if k == "weight_loader"}
        w13 = torch.empty(num_experts, 2 * inter // pack, hidden_size, dtype=torch.int8)
        _register(layer, "w13_weight", w13, attrs)
        _register(layer, "w2_weight", torch.empty(num_experts, hidden_size // pack, inter, dtype=torch.int8), attrs)
        dtype = self.scale_dtype or params_dtype
        names = ("weight_scale", "weight_offset") if self.has_offset else ("weight_scale",)
        for name in names:
            _register(layer, f"w13_{name}", torch.empty(num_experts, 2 * inter, 1, dtype=dtype), attrs, channel=True)
            _register(layer, f"w2_{name}", torch.empty(num_experts, hidden_size, 1, dtype=dtype), attrs, channel=True)
        if self.int4:
            _register(layer, "w13_scale_bias", torch.empty(num_experts, 2 * inter, 1, dtype=torch.float32), attrs,
                      channel=True)
            _register(layer, "w2_scale_bias", torch.empty(num_experts, hidden_size, DOWN_SCALE_BIAS_PARTS,
                                                          dtype=torch.float32), attrs, channel=True)
        layer.ascend_quant_type = self.quant_type
        adopt(layer)
        if layer._ascend_eplb is not None:
            raise QuantizationRefusedError(f"{self.prefix}: 'eplb' does not move quantized experts' scales; serve "
                                           f"{self.quant_type} experts without it")

    def process_weights_after_loading(self, layer: Any) -> None:
        # The kernels' [E, K, N] layout: one transpose now (vllm-ascend does the same), none per forward.
        layer.w13_weight = _frozen(layer.w13_weight.data.transpose(1, 2).contiguous())
        layer.w2_weight = _frozen(layer.w2_weight.data.transpose(1, 2).contiguous())
        layer.w13_weight_scale = _frozen(layer.w13_weight_scale.data.squeeze(-1).float())
        layer.w2_weight_scale = _frozen(layer.w2_weight_scale.data.squeeze(-1).float())
        if self.has_offset:
            del layer.w13_weight_offset, layer.w2_weight_offset  # symmetric weights: ModelSlim writes zeros
        if self.int4:
            layer.w13_scale_bias = _frozen(layer.w13_scale_bias.data.sum(-1))
            layer.w2_scale_bias = _frozen(layer.w2_scale_bias.data.sum(-1))
        layer.ascend_after_loading()

    def apply_experts(self, layer: Any, x: torch.Tensor, topk_weights: torch.Tensor,
                      local_ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' sum for each token (pairs with id -1 belong to other ranks)."""
        return kernel_ops().fused_moe_quant(
            x, layer.w13_weight, layer.w2_weight, layer.w13_weight_scale, layer.w2_weight_scale, topk_weights,
            local_ids, int4=self.int4, w13_bias=getattr(layer, "w13_scale_bias", None) if self.int4 else None,
            w2_bias=getattr(layer, "w2_scale_bias", None) if self.int4 else None)

    def apply_monolithic(self, layer: Any, x: torch.Tensor, router_logits: torch.Tensor,
                         input_ids: torch.Tensor | None = None) -> torch.Tensor:
        return layer.forward_monolithic(x, router_logits, input_ids)


class W8A8DynamicMoE(AscendQuantMoEMethod):
    quant_type = "W8A8_DYNAMIC"


class W4A8DynamicMoE(AscendQuantMoEMethod):
    quant_type = "W4A8_DYNAMIC"
    int4 = True
    scale_dtype = torch.float32


class CompressedInt8DynamicMoE(AscendQuantMoEMethod):
    """compressed-tensors int8 W8A8 experts: channel-wise weights, dynamic per-token activations."""

    quant_type = "compressed-tensors W8A8 int8 (dynamic per-token)"
    scale_dtype = torch.float32
    has_offset = False


MOE_SCHEMES = {"W8A8_DYNAMIC": W8A8DynamicMoE, "W4A8_DYNAMIC": W4A8DynamicMoE}
