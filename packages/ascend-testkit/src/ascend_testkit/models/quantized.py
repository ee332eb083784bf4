"""Tiny int8 checkpoints of the tiny Llama, quantized offline by an honest post-training quantizer, in two formats.

One quantization of the float model, written twice:
- compressed-tensors (what plain vLLM serves): `int-quantized`, channel-wise symmetric int8 weights (`weight`,
  `weight_scale` [N, 1]); activations either static per-tensor with a zero point (`input_scale`,
  `input_zero_point`, calibrated by min/max over calibration prompts) or dynamic per-token symmetric.
- ModelSlim's "ascend" format (`quant_model_description.json`, no `quantization_config` in config.json) holding the
  SAME integers: W8A8 (`input_scale`, `input_offset` = the zero point, `deq_scale` = input_scale x weight_scale,
  float32 for bfloat16 / float32 models and int64 holding the float32 bits for float16 ones, `quant_bias` = -offset x
  rowsum(W), `weight_scale` / `weight_offset`), W8A8_DYNAMIC (`weight_scale`, `weight_offset` zeros), W8A16 (the
  same tensors, weight-only), FLOAT (the float weight in the model dtype).
Scales are rounded to the model dtype before the weights are quantized with them, so both formats (the ModelSlim
one stores scales in the model dtype) carry identical values. Embeddings, norms and the LM head stay float.
`conditioning` (`DYNAMIC_CONDITIONING` for the dynamic twins) rescales a few float tensors before quantizing, so
that the noise a bfloat16 engine with per-token int8 activations cannot avoid stays below the tiny model's logit
margins, and a float64 reference of the checkpoint's integers is an anchor (`models.quantized_reference`). The float
tiny Llama is built for float32 engines (initializer range 1.0): its layers' outputs dwarf the embedding and its
attention scores run large, so one int8 rounding flipped by bfloat16 moves later tokens. Measured with transformers,
float64 exact against float64 with the activations and linear outputs rounded to bfloat16, 12 greedy tokens on 100
prompts (`check_logprobs_close`; the chosen token's logprob over the common prefix): unconditioned 10 failed, largest
difference 1.15; conditioned 0 failed, 0.22 (p99 0.13). The factors: the embedding raised so the residual stream
carries the layers' outputs instead of being replaced by them, the query projection shrunk to O(1) attention scores,
the attention and MLP outputs brought to the embedding's size.
ModelSlim only: `kv_cache="C8"` adds the int8 KV cache's per-channel K/V scales and offsets, calibrated on the float
model (`ascend_testkit.models.quantized_kv`), with `kv_cache_type: "C8"`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.quantized_kv import KV_QUANT_TYPE, SCALE_SUFFIXES, c8_tensors
from ascend_testkit.models.tiny_llama import TinyModelSpec, cached_tiny_llama, prompt_of_length

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DESCRIPTION_FILE = "quant_model_description.json"
CALIBRATION_LENGTHS = (7, 33, 64, 129)
# (name pattern, factor): the first pattern a float tensor's name matches wins (see the module docstring).
DYNAMIC_CONDITIONING: tuple[tuple[str, float], ...] = (
    (r"\.embed_tokens\.weight$", 100.0), (r"\.self_attn\.q_proj\.weight$", 0.05),
    (r"\.self_attn\.o_proj\.weight$", 0.5), (r"\.mlp\.down_proj\.weight$", 0.1))


@dataclass(frozen=True)
class QuantizedSpec:
    base: TinyModelSpec = TinyModelSpec()
    dtype: str = "bfloat16"
    fmt: str = "compressed-tensors"  # or "modelslim"
    activations: str = "dynamic"  # compressed-tensors: "static" | "dynamic"; modelslim: the default type's
    # ModelSlim only: a type per linear (`model.layers.1.mlp.down_proj`) overriding the default one.
    layer_types: tuple[tuple[str, str], ...] = field(default=())
    kv_cache: str = ""  # ModelSlim only: "C8" for an int8 KV cache
    conditioning: tuple[tuple[str, float], ...] = field(default=())  # float tensors rescaled before quantizing

    def key(self) -> str:
        fields = asdict(self)
        for name in ("kv_cache", "conditioning"):  # checkpoints without them keep the folders (keys) they had
            if not fields[name]:
                del fields[name]
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]

    def default_type(self) -> str:
        return {"static": "W8A8", "dynamic": "W8A8_DYNAMIC"}.get(self.activations, self.activations)


def _linear_names(num_layers: int) -> list[str]:
    names = []
    for i in range(num_layers):
        for proj in LINEARS:
            part = "self_attn" if proj in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            names.append(f"model.layers.{i}.{part}.{proj}")
    return names


def conditioned(factors: tuple[tuple[str, float], ...], name: str, tensor):
    """`tensor` (the float model's `name`) times the factor of the first pattern in `factors` it matches, if any."""
    for pattern, factor in factors:
        if re.search(pattern, name):
            return tensor * factor
    return tensor


def _calibrate(float_dir: Path, names: list[str], conditioning=()) -> dict[str, tuple[float, float]]:
    """min / max of each linear's input over the calibration prompts (the float model, conditioned, float64)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(float_dir, torch_dtype=torch.float64).eval()
    if conditioning:
        model.load_state_dict({k: conditioned(conditioning, k, v) for k, v in model.state_dict().items()})
    tok = AutoTokenizer.from_pretrained(float_dir)
    stats: dict[str, tuple[float, float]] = {}
    modules = dict(model.named_modules())
    hooks = []
    for name in names:
        def hook(_module, inputs, _output, name=name):
            x = inputs[0]
            lo, hi = stats.get(name, (0.0, 0.0))  # the range holds 0: zero activations stay exact
            stats[name] = (min(lo, x.min().item()), max(hi, x.max().item()))
        hooks.append(modules[name].register_forward_hook(hook))
    with torch.no_grad():
        for n in CALIBRATION_LENGTHS:
            ids = tok(prompt_of_length(n, offset=11 * n), return_tensors="pt")["input_ids"]
            model(ids)
    for h in hooks:
        h.remove()
    return stats


def _in_dtype(value, dtype):
    import torch

    return torch.as_tensor(value, dtype=torch.float64).to(dtype).to(torch.float32)


def quantize_weights(weight, dtype):
    """Channel-wise symmetric int8: scale = max|row| / 127 rounded to `dtype`, q = round(w / scale)."""
    import torch

    w = weight.to(torch.float64)
    scale = _in_dtype(w.abs().amax(dim=1).clamp(min=1e-8) / 127, dtype)
    q = torch.round(w / scale.to(torch.float64)[:, None]).clamp(-128, 127).to(torch.int8)
    return q, scale


def static_activation_params(lo: float, hi: float, dtype):
    """Asymmetric per-tensor int8 over [lo, hi]: scale (rounded to `dtype`) and integer zero point."""
    import torch

    scale = _in_dtype(max(hi - lo, 1e-8) / 255, dtype)
    zero = torch.round(torch.tensor(-128 - lo / scale.item())).clamp(-128, 127)
    return scale.reshape(1), zero.reshape(1)


def _ct_config(activations: str) -> dict:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False,
               "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    if activations == "static":
        acts = {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "tensor", "dynamic": False,
                "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
                "observer_kwargs": {}}
    else:
        acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True,
                "group_size": None, "block_structure": None, "actorder": None, "observer": None,
                "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ["lm_head"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None}}}


def _modelslim_layer(name, q, w_scale, act, kind, dtype, weight) -> dict:
    import torch

    if kind == "FLOAT":
        return {f"{name}.weight": weight.to(dtype)}
    n = q.shape[0]
    out = {f"{name}.weight": q, f"{name}.weight_scale": w_scale.to(dtype).reshape(n, 1),
           f"{name}.weight_offset": torch.zeros(n, 1, dtype=dtype)}
    if kind == "W8A8":
        scale, zero = act
        deq = scale.float() * w_scale.float()
        out[f"{name}.input_scale"] = scale.to(dtype)
        out[f"{name}.input_offset"] = zero.to(dtype)
        out[f"{name}.quant_bias"] = (-zero.to(torch.int64) * q.to(torch.int64).sum(dim=1)).to(torch.int32)
        out[f"{name}.deq_scale"] = deq.view(torch.int32).to(torch.int64) if dtype == torch.float16 else deq
    elif kind not in ("W8A8_DYNAMIC", "W8A16"):
        raise ValueError(f"ModelSlim type {kind!r} for {name}: this quantizer writes FLOAT, W8A8, W8A8_DYNAMIC, W8A16")
    return out


def build_quantized_llama(path: str | os.PathLike, spec: QuantizedSpec, float_dir: Path) -> Path:
    """Write `spec`'s checkpoint of the float tiny Llama in `float_dir` to `path`."""
    import torch
    from safetensors.torch import load_file, save_file

    dtype = getattr(torch, spec.dtype)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for item in float_dir.iterdir():
        if item.suffix != ".safetensors" and item.name != "config.json":
            shutil.copy(item, path / item.name)
    tensors = {k: conditioned(spec.conditioning, k, v.double()) if spec.conditioning else v
               for f in sorted(float_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    names = _linear_names(spec.base.num_layers)
    overrides = dict(spec.layer_types)
    static = spec.fmt == "compressed-tensors" and spec.activations == "static"
    needs_stats = static or (spec.fmt == "modelslim" and "W8A8" in {spec.default_type(), *overrides.values()})
    stats = _calibrate(float_dir, names, spec.conditioning) if needs_stats else {}
    out = {k: v.to(dtype) for k, v in tensors.items() if not any(k.startswith(n + ".") for n in names)}
    for name in names:
        weight = tensors[f"{name}.weight"]
        q, w_scale = quantize_weights(weight, dtype)
        act = static_activation_params(*stats[name], dtype) if name in stats else None
        if spec.fmt == "compressed-tensors":
            out[f"{name}.weight"] = q
            out[f"{name}.weight_scale"] = w_scale.reshape(-1, 1)
            if static:
                out[f"{name}.input_scale"] = act[0]
                out[f"{name}.input_zero_point"] = act[1].to(torch.int8)
        else:
            out.update(_modelslim_layer(name, q, w_scale, act, overrides.get(name, spec.default_type()), dtype,
                                        weight))
    if spec.kv_cache:
        if spec.conditioning:
            raise ValueError("kv_cache with conditioning: C8 calibrates the unconditioned float model")
        if spec.fmt != "modelslim" or spec.kv_cache != KV_QUANT_TYPE:
            raise ValueError(f"kv_cache={spec.kv_cache!r} with fmt={spec.fmt!r}: this quantizer writes ModelSlim C8")
        out.update(c8_tensors(float_dir, spec.base.num_layers, dtype, prompt_of_length))
    save_file(out, str(path / "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text())
    config["torch_dtype"] = spec.dtype
    config.pop("dtype", None)
    if spec.fmt == "compressed-tensors":
        config["quantization_config"] = _ct_config(spec.activations)
    else:
        description = {"model_quant_type": spec.default_type(), "version": "1.0.0"}
        description.update({k: "FLOAT" for k in out if not any(k.startswith(n + ".") for n in names)})
        for name in names:
            kind = overrides.get(name, spec.default_type())
            description.update({k: kind for k in out if k.startswith(name + ".") and not k.endswith(SCALE_SUFFIXES)})
        if spec.kv_cache:
            description["kv_cache_type"] = spec.kv_cache
            description.update({k: spec.kv_cache for k in out if k.endswith(SCALE_SUFFIXES)})
        (path / DESCRIPTION_FILE).write_text(json.dumps(description, indent=1, sort_keys=True))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def cached_quantized_llama(spec: QuantizedSpec = QuantizedSpec(),
                           cache_dir: str | os.PathLike | None = None) -> Path:
    """`spec`'s checkpoint, built once into the cache (from the float tiny Llama of `spec.base`, also cached)."""
    cache = Path(cache_dir or default_cache_dir())
    float_dir = cached_tiny_llama(spec.base, cache)
    folder = cache / f"tiny-llama-{spec.fmt}-{spec.activations}-{spec.key()}"
    return built_once(folder, lambda tmp: build_quantized_llama(tmp, spec, float_dir))
