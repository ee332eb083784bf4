"""ModelSlim's C8 int8 KV cache (`kv_cache_type` / `kv_quant_type` "C8") for dense (MHA / GQA) attention layers.

Checkpoint tensors per attention layer, as ModelSlim writes them (MindIE's and vllm-ascend's reading):
`<attn>.k_proj.kv_cache_scale`, `.k_proj.kv_cache_offset`, `.v_proj.kv_cache_scale`, `.v_proj.kv_cache_offset`, each
`[num_kv_heads * head_dim]` (per channel of the cached keys / values, after rotary embedding) or one value (per
tensor), in the model dtype. A cached value is `q = clamp(round(x / scale + offset))` and reads back as `(q - offset)
* scale`.

`AscendC8KVCacheMethod` is vLLM's `BaseKVCacheMethod` (the contract vLLM's attention layers call through
`_init_kv_cache_quant`): `create_weights` registers the four tensors as the layer's `k_cache_scale`,
`k_cache_offset`, `v_cache_scale`, `v_cache_offset` (the config's `get_cache_scale_mapper` renames the checkpoint's
names onto them) and makes the layer's KV spec int8, so vLLM plans int8 pages and our allocator cuts int8 K and V
planes (half of bfloat16's bytes per block). After loading, the layer carries `ascend_kv_quant` (`KVCacheQuant`,
float32 vectors on the layer's device), which the Ascend attention backend hands to `ascend_kernels`'
`reshape_and_cache_quant` and `paged_attention_antiquant`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ascend_core.upstream import kv_cache_quantization_api, set_layer_kv_cache_dtype
from ascend_platform.quantization.errors import QuantizationRefusedError, QuantizedCheckpointError

_API = kv_cache_quantization_api()
KV_QUANT_TYPE = "C8"
# checkpoint suffix (after `<layer>.self_attn`) -> the attention layer's parameter
SCALE_NAMES = {"k_proj.kv_cache_scale": "k_cache_scale", "k_proj.kv_cache_offset": "k_cache_offset",
               "v_proj.kv_cache_scale": "v_cache_scale", "v_proj.kv_cache_offset": "v_cache_offset"}


@dataclass(frozen=True)
class KVCacheQuant:
    """One layer's static int8 KV quantization: float32 `[num_kv_heads * head_size]` (or `[1]`) vectors; an offset
    is None when the checkpoint's is zero everywhere (symmetric)."""

    key_scale: torch.Tensor
    key_offset: torch.Tensor | None
    value_scale: torch.Tensor
    value_offset: torch.Tensor | None


def _rank_channels(loaded: torch.Tensor, head_size: int) -> torch.Tensor:
    """This tensor-parallel rank's KV heads of a per-channel vector (as QKVParallelLinear splits the KV heads: a
    rank holds `total / tp` of them, or one head replicated on `tp / total` ranks); a per-tensor value as it is."""
    flat = loaded.reshape(-1)
    if flat.numel() == 1:
        return flat
    total_heads = flat.numel() // head_size
    rank, size = _API.tp_rank(), _API.tp_size()
    if size >= total_heads:
        first, count = rank // (size // total_heads), 1
    else:
        count = total_heads // size
        first = rank * count
    return flat.view(total_heads, head_size)[first:first + count].reshape(-1)


def _loader(head_size: int):
    def load(param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        values = _rank_channels(loaded, head_size)
        if values.numel() not in (1, param.numel()):
            raise QuantizedCheckpointError(
                f"C8 KV cache scale of {loaded.numel()} values for a layer of {param.numel()} channels per rank")
        param.data = values.to(device=param.device, dtype=param.dtype).clone()
    return load


class AscendC8KVCacheMethod(_API.BaseKVCacheMethod):
    """C8 for one dense attention layer (see the module docstring)."""

    def __init__(self, quant_config, prefix: str) -> None:
        super().__init__(quant_config)
        self.prefix = prefix

    def create_weights(self, layer: torch.nn.Module) -> None:
        if getattr(layer, "kv_sharing_target_layer_name", None) is not None:
            raise QuantizationRefusedError(
                f"ascend quantization: C8 on attention layer {self.prefix!r}, which reads the KV cache of "
                f"{layer.kv_sharing_target_layer_name!r}, is not supported (its pages hold the other layer's scales)")
        super().create_weights(layer)  # vLLM's own (unused) q/k/v/prob scales, which its loader and checks expect
        set_layer_kv_cache_dtype(layer, torch.int8)
        channels = layer.num_kv_heads * layer.head_size
        for name in SCALE_NAMES.values():
            param = torch.nn.Parameter(torch.empty(channels, dtype=torch.get_default_dtype()), requires_grad=False)
            param.weight_loader = _loader(layer.head_size)
            layer.register_parameter(name, param)

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        super().process_weights_after_loading(layer)
        vectors = {}
        for checkpoint, name in SCALE_NAMES.items():
            t = getattr(layer, name).data.float()
            where = f"{self.prefix.rsplit('.', 1)[0]}.{checkpoint}"
            if not torch.isfinite(t).all():
                raise QuantizedCheckpointError(f"C8 KV cache: {where} holds non-finite values")
            if name.endswith("scale") and not (t > 0).all():
                raise QuantizedCheckpointError(f"C8 KV cache: {where} holds a scale <= 0")
            if name.endswith("offset") and bool((t.round() != t).any() or (t < -128).any() or (t > 127).any()):
                raise QuantizedCheckpointError(f"C8 KV cache: {where} is not an int8 zero point")
            vectors[name] = t
            delattr(layer, name)
        layer.ascend_kv_quant = KVCacheQuant(
            key_scale=vectors["k_cache_scale"], key_offset=_offset(vectors["k_cache_offset"]),
            value_scale=vectors["v_cache_scale"], value_offset=_offset(vectors["v_cache_offset"]))


def _offset(t: torch.Tensor) -> torch.Tensor | None:
    return None if not t.any() else t


def cache_scale_mapper():
    """Checkpoint names -> the attention layer's parameters (`<...>.self_attn.k_proj.kv_cache_scale` ->
    `<...>.self_attn.attn.k_cache_scale`, ...)."""
    return _API.WeightsMapper(orig_to_new_suffix={f".{ckpt}": f".attn.{name}" for ckpt, name in SCALE_NAMES.items()})


def is_dense_attention(layer) -> bool:
    return isinstance(layer, _API.Attention)


def is_mla_attention(layer) -> bool:
    return isinstance(layer, _API.MLAAttention)
