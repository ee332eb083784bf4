"""vLLM's quantization interfaces the Ascend quantization methods subclass and call, in one place.

`quantization_api()` imports them on first use (a process that serves no quantized model never loads them); the
pins in `ascend_core/upstream_pins.toml` name each symbol, so a release that moves one is reported by
`ascend-vllm contracts check` before an engine fails on it.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace


@functools.cache
def quantization_api() -> SimpleNamespace:
    from vllm.model_executor.layers.linear import LinearBase, LinearMethodBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization import register_quantization_config
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_w8a8_int8 import (
        CompressedTensorsW8A8Int8,
    )
    from vllm.model_executor.parameter import (
        BasevLLMParameter,
        ChannelQuantScaleParameter,
        ModelWeightParameter,
        PerTensorScaleParameter,
    )

    return SimpleNamespace(
        LinearBase=LinearBase, LinearMethodBase=LinearMethodBase,
        UnquantizedLinearMethod=UnquantizedLinearMethod, register_quantization_config=register_quantization_config,
        QuantizationConfig=QuantizationConfig, CompressedTensorsConfig=CompressedTensorsConfig,
        CompressedTensorsW8A8Int8=CompressedTensorsW8A8Int8, BasevLLMParameter=BasevLLMParameter,
        ChannelQuantScaleParameter=ChannelQuantScaleParameter, ModelWeightParameter=ModelWeightParameter,
        PerTensorScaleParameter=PerTensorScaleParameter)


def rebuild_quant_config(vllm_config) -> object:
    """The quantization config vLLM builds for `vllm_config.model_config.quantization` (VllmConfig's own
    `_get_quantization_config`: the method's config file, capability and dtype checks)."""
    from vllm.config import VllmConfig

    return VllmConfig._get_quantization_config(vllm_config.model_config, vllm_config.load_config)
