"""compressed-tensors int8 W8A8 on the Ascend platform: vLLM's own config parsing, the layers run by our kernels.

vLLM's `CompressedTensorsW8A8Int8` asks `init_int8_linear_kernel` for a kernel of the current platform, and vLLM
lists int8 scaled-mm kernels for CUDA, ROCm, XPU and CPU only: on an out-of-tree platform the first linear's
`create_weights` fails ("no kernel"). `AscendCompressedTensorsConfig` keeps the parsing (config groups, targets,
ignore lists) and gives each int8 W8A8 linear `AscendCompressedInt8Method` instead; any other scheme or a KV cache
scheme is refused at model construction, naming the layer and its scheme. Routed experts: int8 W8A8 with dynamic
per-token activations (vLLM's own reading of the scheme, `_is_dynamic_token_w8a8`) run `CompressedInt8DynamicMoE`
(`moe_schemes`); experts the config ignores stay float; any other expert scheme is refused naming the layer.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

from ascend_core.upstream import quantization_api
from ascend_platform.quantization import int8_matmuls
from ascend_platform.quantization.errors import QuantizationRefusedError
from ascend_platform.quantization.moe_schemes import CompressedInt8DynamicMoE

_API = quantization_api()
METHOD = "compressed-tensors"


class AscendCompressedInt8Method(_API.LinearMethodBase):
    """int8 weights (channel- or tensor-wise symmetric) with static per-tensor (symmetric or with a zero point) or
    dynamic per-token symmetric int8 activations: the checkpoint's tensors as vLLM's int8 scheme declares them."""

    def __init__(self, scheme) -> None:
        self.channelwise = str(scheme.strategy) in ("channel", "QuantizationStrategy.CHANNEL")
        self.static = bool(scheme.is_static_input_scheme)
        self.symmetric = bool(scheme.input_symmetric)

    def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size, output_size,
                       params_dtype, **extra_weight_attrs):
        loader = extra_weight_attrs["weight_loader"]
        n = sum(output_partition_sizes)
        layer.logical_widths = output_partition_sizes
        layer.register_parameter("weight", _API.ModelWeightParameter(
            data=torch.empty(n, input_size_per_partition, dtype=torch.int8), input_dim=1, output_dim=0,
            weight_loader=loader))
        if self.channelwise:
            scale = _API.ChannelQuantScaleParameter(data=torch.empty(n, 1, dtype=torch.float32), output_dim=0,
                                                    weight_loader=loader)
        else:
            scale = _API.PerTensorScaleParameter(data=torch.empty(len(output_partition_sizes), dtype=torch.float32),
                                                 weight_loader=loader)
        layer.register_parameter("weight_scale", scale)
        if self.static:
            layer.register_parameter("input_scale", _API.BasevLLMParameter(
                data=torch.empty(1, dtype=torch.float32), weight_loader=loader))
            if not self.symmetric:
                # compressed-tensors stores the zero point in the weights' dtype (int8).
                layer.register_parameter("input_zero_point", _API.BasevLLMParameter(
                    data=torch.empty(1, dtype=torch.int8), weight_loader=loader))

    def process_weights_after_loading(self, layer) -> None:
        scale = layer.weight_scale.data
        if not self.channelwise:  # one scale per fused shard, spread over its rows
            scale = torch.cat([s.expand(w) for s, w in zip(scale, layer.logical_widths, strict=True)])
        scale = scale.reshape(-1).float()
        weight = layer.weight.data
        layer.weight = torch.nn.Parameter(weight, requires_grad=False)
        if self.static:
            input_scale = layer.input_scale.data.float()
            layer.deq_scale = torch.nn.Parameter(input_scale * scale, requires_grad=False)
            layer.input_scale = torch.nn.Parameter(input_scale, requires_grad=False)
            offset = getattr(layer, "input_zero_point", None)
            if offset is not None:
                offset = offset.data.float()
                layer.input_zero_point = torch.nn.Parameter(offset, requires_grad=False)
                layer.quant_bias = torch.nn.Parameter(int8_matmuls.offset_correction(weight, offset),
                                                      requires_grad=False)
            else:
                layer.quant_bias = None
            del layer.weight_scale
        else:
            layer.weight_scale = torch.nn.Parameter(scale, requires_grad=False)

    def apply(self, layer, x, bias=None):
        if self.static:
            return int8_matmuls.static_w8a8(x, layer.weight, layer.input_scale, getattr(layer, "input_zero_point",
                                            None), layer.deq_scale, layer.quant_bias, bias)
        return int8_matmuls.dynamic_w8a8(x, layer.weight, layer.weight_scale, bias)


def _refuse(prefix: str, what: str) -> None:
    raise QuantizationRefusedError(
        f"compressed-tensors layer {prefix!r}: {what} is not supported on the Ascend platform (it serves int8 W8A8 "
        "linears: channel- or tensor-wise int8 weights, static per-tensor or dynamic per-token int8 activations; and "
        "int8 experts: channel-wise weights, dynamic per-token int8 activations)")


class AscendCompressedTensorsConfig(_API.CompressedTensorsConfig):
    """vLLM's compressed-tensors config whose int8 W8A8 linears run on `ascend_kernels`."""

    def get_quant_method(self, layer, prefix):
        if isinstance(layer, _API.LinearBase):
            scheme = self.get_scheme(layer=layer, layer_name=prefix)
            if scheme is None:
                return _API.UnquantizedLinearMethod()
            if not isinstance(scheme, _API.CompressedTensorsW8A8Int8):
                _refuse(prefix, f"linear scheme {type(scheme).__name__}")
            return AscendCompressedInt8Method(scheme)
        if isinstance(layer, RoutedExperts):
            return self._experts_method(layer, prefix)
        if getattr(self, "kv_cache_scheme", None) is not None and type(layer).__name__ == "Attention":
            _refuse(prefix, f"KV cache scheme {self.kv_cache_scheme}")
        return super().get_quant_method(layer, prefix)

    def _experts_method(self, layer, prefix):
        # vLLM's CompressedTensorsMoEMethod.get_moe_method reads the scheme the same way (expert 0's projections,
        # which must agree), then picks a CUDA / CPU kernel class; here the int8 dynamic form runs on our kernels.
        self._add_fused_moe_to_target_scheme_map()
        projs = (layer.ckpt_gate_proj_name, layer.ckpt_up_proj_name, layer.ckpt_down_proj_name)
        schemes = [self.get_scheme_dict(layer, f"{prefix}.0.{proj}") for proj in projs]
        if any(s != schemes[0] for s in schemes):
            _refuse(prefix, "experts whose projections have different schemes")
        scheme = schemes[0]
        if scheme is None:
            return None  # ignored: float experts (vLLM's unquantized method, the platform's AscendMoEMethod)
        weights, inputs = scheme.get("weights"), scheme.get("input_activations")
        if not self._is_dynamic_token_w8a8(weights, inputs):
            _refuse(prefix, f"expert scheme (weights {_describe(weights)}, input activations {_describe(inputs)})")
        return CompressedInt8DynamicMoE(layer.moe_config, prefix)


def _describe(args) -> str:
    if args is None:
        return "none"
    strategy = getattr(args.strategy, "value", args.strategy)
    return (f"{args.num_bits}-bit {getattr(args.type, 'value', args.type)} {strategy} "
            f"{'dynamic' if args.dynamic else 'static'}"
            f"{'' if args.symmetric else ' asymmetric'}")
