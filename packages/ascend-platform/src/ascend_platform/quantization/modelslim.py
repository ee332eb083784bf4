"""The out-of-tree "ascend" quantization method: ModelSlim checkpoints (`quant_model_description.json`).

The description maps every tensor name to its quantization type (`FLOAT`, `W8A8`, `W8A8_DYNAMIC`, `W8A16`,
`W4A8_DYNAMIC`, `C8`, ...) beside global keys (`model_quant_type`, `version`, `kv_cache_type`, ...; keys without a
dot). A linear's type is its weight's; a fused layer (`qkv_proj`, `gate_up_proj`) resolves its shards through the
model's packed-modules mapping and all shards must share one type; a routed-experts layer's type is the one every
expert projection of it shares. Served: W8A8, W8A8_DYNAMIC, W8A16 and FLOAT linears; W8A8_DYNAMIC, W4A8_DYNAMIC
(per-channel) and FLOAT experts. Refused at model construction, naming the layer and its type: any other linear or
expert type, experts of mixed types, per-group W4A8 (`group_size` > 0), a quantized embedding or LM head, C8 on an
MLA attention layer or on an attention layer the checkpoint has no C8 scales for, and (at config time) any other KV
cache / FA quantization type. C8 (`kv_cache_type` or `kv_quant_type` "C8") gives each dense attention layer the int8
KV cache method of `kv_c8`.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

from ascend_core.upstream import quantization_api
from ascend_platform.quantization import kv_c8
from ascend_platform.quantization.errors import QuantizationRefusedError, QuantizedCheckpointError
from ascend_platform.quantization.modelslim_schemes import LINEAR_SCHEMES
from ascend_platform.quantization.moe_schemes import MOE_SCHEMES

_API = quantization_api()
METHOD = "ascend"
DESCRIPTION_FILE = "quant_model_description.json"
FLOAT = "FLOAT"
_KV_KEYS = ("kv_cache_type", "kv_quant_type")  # C8 served; MindIE's docs name the key either way
_FA_KEYS = ("fa_quant_type",)  # quantized attention (FAQuant / FAKQuant: MLA's q/k/v), refused
_EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")


def tensor_types(description: dict) -> dict[str, str]:
    """The description's per-tensor entries (tensor names contain a dot; global keys do not)."""
    return {k: v for k, v in description.items() if "." in k}


def kv_cache_type(description: dict) -> str | None:
    """The description's KV cache quantization ("C8", or None for a float KV cache); any other KV cache or
    attention quantization type is refused."""
    found = None
    for key in _KV_KEYS:
        value = description.get(key)
        if value in (None, "", FLOAT):
            continue
        if value != kv_c8.KV_QUANT_TYPE:
            raise QuantizationRefusedError(
                f"ascend quantization: {key}={value!r} (a quantized KV cache) is not supported; this platform "
                f"serves float KV caches and C8 (int8, static per-channel scales) on dense attention")
        found = value
    for key in _FA_KEYS:
        value = description.get(key)
        if value not in (None, "", FLOAT):
            raise QuantizationRefusedError(
                f"ascend quantization: {key}={value!r} (quantized attention) is not supported; this platform "
                "serves float KV caches and C8 (int8 KV cache) on dense attention")
    return found


class AscendModelSlimConfig(_API.QuantizationConfig):
    """ModelSlim's per-tensor description as a vLLM quantization config."""

    def __init__(self, description: dict) -> None:
        super().__init__()
        self.description = dict(description)
        self.types = tensor_types(description)
        self.kv_cache_type = kv_cache_type(description)
        scales = sorted(k for k in self.types if k.endswith((".kv_cache_scale", ".kv_cache_offset")))
        if scales and self.kv_cache_type != kv_c8.KV_QUANT_TYPE:
            raise QuantizedCheckpointError(
                f"ascend quantization: {DESCRIPTION_FILE} names C8 KV cache tensor {scales[0]!r} but no "
                "kv_cache_type 'C8'")

    @classmethod
    def get_name(cls) -> str:
        return METHOD

    @classmethod
    def get_supported_act_dtypes(cls) -> list[torch.dtype]:
        return [torch.bfloat16, torch.float16, torch.float32]

    @classmethod
    def get_min_capability(cls) -> int:
        return 0  # no CUDA capability applies; the platform reports none

    @classmethod
    def get_config_filenames(cls) -> list[str]:
        return [DESCRIPTION_FILE]

    @classmethod
    def from_config(cls, config: dict) -> AscendModelSlimConfig:
        return cls(config)

    def layer_type(self, prefix: str) -> str:
        """The quantization type of the layer at `prefix` (its shards' common type for a fused layer)."""
        last = prefix.rsplit(".", 1)[-1]
        shards = self.packed_modules_mapping.get(last) or [last]
        names = [f"{prefix[: len(prefix) - len(last)]}{shard}.weight" for shard in shards]
        missing = [n for n in names if n not in self.types]
        if missing:
            raise QuantizedCheckpointError(
                f"ascend quantization: {DESCRIPTION_FILE} names no type for tensor {missing[0]!r} (layer {prefix!r})")
        found = {self.types[n] for n in names}
        if len(found) != 1:
            raise QuantizationRefusedError(
                f"ascend quantization: the shards of fused layer {prefix!r} have different types "
                f"{ {n: self.types[n] for n in names} } (one kernel runs the fused layer)")
        return found.pop()

    def get_quant_method(self, layer, prefix):
        if isinstance(layer, _API.LinearBase):
            kind = self.layer_type(prefix)
            if kind == FLOAT:
                return _API.UnquantizedLinearMethod()
            if kind not in LINEAR_SCHEMES:
                raise QuantizationRefusedError(
                    f"ascend quantization: layer {prefix!r} ({type(layer).__name__}) has type {kind!r}; served "
                    f"linear types: {', '.join([*LINEAR_SCHEMES, FLOAT])}")
            return LINEAR_SCHEMES[kind]()
        if isinstance(layer, RoutedExperts):
            return self._experts_method(layer, prefix)
        if self.kv_cache_type is not None and (kv_c8.is_dense_attention(layer) or kv_c8.is_mla_attention(layer)):
            return self._kv_cache_method(layer, prefix)
        kind = self.types.get(f"{prefix}.weight")
        if kind not in (None, FLOAT):
            raise QuantizationRefusedError(
                f"ascend quantization: layer {prefix!r} ({type(layer).__name__}) has type {kind!r}; only linears "
                "are quantized on this platform")
        return None

    def experts_type(self, layer, prefix: str) -> str:
        """The one type of every expert projection weight of the routed-experts layer at `prefix`."""
        names = [f"{prefix}.{e}.{proj}.weight" for e in range(layer.global_num_experts) for proj in _EXPERT_PROJS]
        found = {}
        for name in names:
            if name not in self.types:
                raise QuantizedCheckpointError(
                    f"ascend quantization: {DESCRIPTION_FILE} names no type for tensor {name!r} (layer {prefix!r})")
            found.setdefault(self.types[name], name)
        if len(found) != 1:
            raise QuantizationRefusedError(
                f"ascend quantization: the experts of layer {prefix!r} have different types "
                f"{ {kind: name for kind, name in found.items()} } (one kernel runs every expert of a layer)")
        return next(iter(found))

    def _experts_method(self, layer, prefix: str):
        kind = self.experts_type(layer, prefix)
        if kind == FLOAT:
            return None  # vLLM's unquantized method: the platform's AscendMoEMethod
        if kind not in MOE_SCHEMES:
            raise QuantizationRefusedError(
                f"ascend quantization: layer {prefix!r} ({type(layer).__name__}) has expert type {kind!r}; served "
                f"expert types: {', '.join([*MOE_SCHEMES, FLOAT])}")
        group_size = int(self.description.get("group_size") or 0)
        if kind == "W4A8_DYNAMIC" and group_size > 0:
            raise QuantizationRefusedError(
                f"ascend quantization: layer {prefix!r} is per-group W4A8_DYNAMIC (group_size={group_size}); only "
                "per-channel int4 experts are served")
        return MOE_SCHEMES[kind](layer.moe_config, prefix)

    def _kv_cache_method(self, layer, prefix: str):
        if kv_c8.is_mla_attention(layer):
            raise QuantizationRefusedError(
                f"ascend quantization: kv_cache_type 'C8' on MLA attention layer {prefix!r} is not supported (C8 "
                "runs on dense MHA / GQA attention; MLA's latent cache stays float)")
        parent = prefix.rsplit(".", 1)[0]
        missing = [f"{parent}.{name}" for name in kv_c8.SCALE_NAMES if f"{parent}.{name}" not in self.types]
        if missing:
            raise QuantizedCheckpointError(
                f"ascend quantization: kv_cache_type 'C8' but {DESCRIPTION_FILE} names no {missing[0]!r} for "
                f"attention layer {prefix!r} (C8 quantizes every attention layer's KV cache or none)")
        return kv_c8.AscendC8KVCacheMethod(self, prefix)

    def get_cache_scale_mapper(self):
        """vLLM's KV-cache scale names, and C8's `k_proj` / `v_proj` `kv_cache_scale` / `kv_cache_offset` onto the
        attention layer's parameters (`kv_c8.cache_scale_mapper`)."""
        base = _API.QuantizationConfig.get_cache_scale_mapper()
        return kv_c8.cache_scale_mapper() | base if self.kv_cache_type is not None else base
