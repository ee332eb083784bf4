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


@functools.cache
def kv_cache_quantization_api() -> SimpleNamespace:
    """vLLM's KV cache quantization contract (`quantization/kv_cache.py`): the attention layers call
    `_init_kv_cache_quant`, which asks the config's `get_quant_method` for a `BaseKVCacheMethod` and lets it
    `create_weights(layer)` right after the layer chose its KV cache dtype (`kv_cache_torch_dtype`, the dtype of the
    layer's KV spec); the weight loader maps checkpoint scale names through the config's `get_cache_scale_mapper`."""
    from vllm.distributed.parallel_state import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
    from vllm.model_executor.layers.attention.attention import Attention
    from vllm.model_executor.layers.attention.mla_attention import MLAAttention
    from vllm.model_executor.layers.quantization.kv_cache import BaseKVCacheMethod
    from vllm.model_executor.models.utils import WeightsMapper

    return SimpleNamespace(
        Attention=Attention, MLAAttention=MLAAttention, BaseKVCacheMethod=BaseKVCacheMethod,
        WeightsMapper=WeightsMapper, tp_rank=get_tensor_model_parallel_rank,
        tp_size=get_tensor_model_parallel_world_size)


def set_layer_kv_cache_dtype(layer, dtype) -> None:
    """Make the attention `layer`'s KV spec (and so the KV memory vLLM plans and our allocator cuts) `dtype`: vLLM's
    layers keep it in `kv_cache_torch_dtype`, read by `get_kv_cache_spec`."""
    if not hasattr(layer, "kv_cache_torch_dtype"):
        raise AttributeError(f"{type(layer).__name__} has no kv_cache_torch_dtype: this vLLM plans the KV cache dtype "
                             "elsewhere (ascend_core.upstream.set_layer_kv_cache_dtype)")
    layer.kv_cache_torch_dtype = dtype


def rebuild_quant_config(vllm_config) -> object:
    """The quantization config vLLM builds for `vllm_config.model_config.quantization` (VllmConfig's own
    `_get_quantization_config`: the method's config file, capability and dtype checks)."""
    from vllm.config import VllmConfig

    return VllmConfig._get_quantization_config(vllm_config.model_config, vllm_config.load_config)
