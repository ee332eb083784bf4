"""The linear schemes of ModelSlim's "ascend" format: each declares the tensors ModelSlim writes for one layer and
runs them through `int8_matmuls`.

Tensors per layer (`<layer>.<name>`; N output rows, K inputs):
- W8A8 (static per-tensor activations with an offset): weight int8 [N, K], input_scale [1], input_offset [1],
  quant_bias int32 [N] (the bias and the offset's correction, in accumulator units), deq_scale [N] (input_scale x
  weight_scale: float32 for bfloat16 and float32 models, int64 holding the float32 bits for float16 ones),
  weight_scale / weight_offset [N, 1] (not needed at run time: deq_scale carries the product).
- W8A8_DYNAMIC (per-token symmetric activations): weight int8 [N, K], weight_scale / weight_offset [N, 1].
- W8A16 (weight only): weight int8 [N, K], weight_scale / weight_offset [N, 1]; dequant is (w + offset) x scale,
  torch_npu's antiquant convention, which vllm-ascend passes the checkpoint's weight_offset to unchanged.
"""

from __future__ import annotations

import torch

from ascend_core.upstream import quantization_api
from ascend_platform.quantization import int8_matmuls

_API = quantization_api()


def _deq_dtype(params_dtype: torch.dtype) -> torch.dtype:
    return torch.int64 if params_dtype == torch.float16 else torch.float32


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)


class _ModelSlimLinear(_API.LinearMethodBase):
    quant_type = ""

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        loader = extra_weight_attrs["weight_loader"]
        n = sum(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.ascend_quant_type = self.quant_type
        layer.register_parameter("weight", _API.ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0,
            weight_loader=loader))
        for name in ("weight_scale", "weight_offset"):
            layer.register_parameter(name, _API.ChannelQuantScaleParameter(
                data=torch.empty(n, 1, dtype=params_dtype), output_dim=0, weight_loader=loader))
        self._extra_weights(layer, n, len(output_partition_sizes), params_dtype, loader)

    def _extra_weights(self, layer, n, shards, params_dtype, loader) -> None:
        pass


class W8A8StaticLinear(_ModelSlimLinear):
    quant_type = "W8A8"

    def _extra_weights(self, layer, n, shards, params_dtype, loader) -> None:
        # One [1] scale and offset per layer: a fused layer's shards quantize the same input, so ModelSlim writes
        # the same values for each (vLLM's loader of fused layers copies every shard's [1] into the one parameter).
        for name in ("input_scale", "input_offset"):
            layer.register_parameter(name, _API.BasevLLMParameter(data=torch.empty(1, dtype=params_dtype),
                                                                  weight_loader=loader))
        layer.register_parameter("quant_bias", _API.ChannelQuantScaleParameter(
            data=torch.empty(n, dtype=torch.int32), output_dim=0, weight_loader=loader))
        layer.register_parameter("deq_scale", _API.ChannelQuantScaleParameter(
            data=torch.empty(n, dtype=_deq_dtype(params_dtype)), output_dim=0, weight_loader=loader))

    def process_weights_after_loading(self, layer) -> None:
        deq = layer.deq_scale.data
        if deq.dtype == torch.int64:  # float32 bits in the low word (ModelSlim's float16 layout)
            deq = deq.to(torch.int32).view(torch.float32)
        layer.deq_scale = _frozen(deq.float())
        layer.input_scale = _frozen(layer.input_scale.data.float())
        layer.input_offset = _frozen(layer.input_offset.data.float())
        layer.weight = _frozen(layer.weight.data)
        layer.quant_bias = _frozen(layer.quant_bias.data)
        del layer.weight_scale, layer.weight_offset

    def apply(self, layer, x, bias=None):
        return int8_matmuls.static_w8a8(x, layer.weight, layer.input_scale, layer.input_offset, layer.deq_scale,
                                        layer.quant_bias, bias)


class W8A8DynamicLinear(_ModelSlimLinear):
    quant_type = "W8A8_DYNAMIC"

    def process_weights_after_loading(self, layer) -> None:
        layer.weight = _frozen(layer.weight.data)
        layer.weight_scale = _frozen(layer.weight_scale.data.reshape(-1).float())
        del layer.weight_offset  # symmetric per-token activations: ModelSlim writes zeros here

    def apply(self, layer, x, bias=None):
        return int8_matmuls.dynamic_w8a8(x, layer.weight, layer.weight_scale, bias)


class W8A16Linear(_ModelSlimLinear):
    quant_type = "W8A16"

    def process_weights_after_loading(self, layer) -> None:
        layer.weight = _frozen(layer.weight.data)
        layer.weight_scale = _frozen(layer.weight_scale.data.reshape(-1))
        layer.weight_offset = _frozen(layer.weight_offset.data.reshape(-1))

    def apply(self, layer, x, bias=None):
        return int8_matmuls.weight_only_w8(x, layer.weight, layer.weight_scale.to(x.dtype),
                                           layer.weight_offset.to(x.dtype), bias)


LINEAR_SCHEMES = {"W8A8": W8A8StaticLinear, "W8A8_DYNAMIC": W8A8DynamicLinear, "W8A16": W8A16Linear}
