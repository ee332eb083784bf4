"""Tiny quantized MoE checkpoints, quantized offline from the float tiny MoE models by an honest post-training
quantizer (round to nearest, per output channel, symmetric).

- `qwen3`: the tiny Qwen3-MoE (`models.moe`): attention projections at `dense` (W8A8_DYNAMIC), experts at `experts`.
- `deepseek`: a tiny DeepSeek-V2 MoE (`models.deepseek`: MLA, a dense first layer, grouped top-k, a shared expert)
  in the production DeepSeek recipe: every non-expert linear W8A8_DYNAMIC (q_proj, kv_a_proj_with_mqa, o_proj, the
  dense and shared MLPs) and W4A8_DYNAMIC experts. kv_b_proj stays FLOAT: MLA up-projects its latent with that
  matrix (and absorbs it on other backends), which ModelSlim's W8A8 for it would need a dequantized copy of anyway.
The router gates, embeddings, norms and LM head stay float.

Formats (what `ascend_platform.quantization` reads):
- ModelSlim (`quant_model_description.json`, no `quantization_config`): W8A8_DYNAMIC weight int8 [N, K], weight_scale
  / weight_offset [N, 1] in the model dtype (scale = max|row| / 127 rounded to it; offset zeros). W4A8_DYNAMIC
  experts: int4 values q = round(w / s) in [-8, 7] with s = max|row| / 7 (float32), packed two per int8 along the
  output rows into [N / 2, K] (row 2j low nibble, 2j + 1 high), weight_scale / weight_offset float32 [N, 1], and
  scale_bias float32 = 8 x s x the row's int4 sum: [N, 1] for gate / up, [H, 16] for down (its K split in 16
  partial sums, ModelSlim's layout for TP), the assist term of the A8W4 kernel.
- compressed-tensors (`qwen3` with W8A8_DYNAMIC only): int8 channel-wise weights with float32 scales, dynamic
  per-token symmetric int8 activations; the router gates and LM head ignored.

Conditioning (`CONDITIONING`): before quantizing, a few of the float model's tensors are rescaled, so that the noise a
quantized engine cannot avoid (bfloat16 rounding, and per-token int8 activations: ~0.6% of each quantized input)
stays small against the model's own logit margins. The float tiny models are built for float32 engines: their layer
outputs dwarf the embedding (a layer's relative error passes whole to the next), DeepSeek's MLA scores run in the
hundreds (softmax as argmax: a near tie between two keys flips on any noise) and routed experts carry weight at
near ties of the router (a flip swaps an expert's whole output). Measured with transformers on the dequantized
twin, float64 against float64 with the engines' int8 activations in bfloat16, 12 greedy tokens per prompt:
`check_logprobs_close` failed on 18 of 200 prompts for Qwen3-MoE and 59 of 100 for DeepSeek-V2; conditioned, on 0 of
200 and 0 of 300. Conditioning keeps the routing and the experts decisive: an expert-id or a top-2-weight mix-up, a
swapped int4 nibble order or a dropped shared expert still fails the check on 40-85% of the prompts (float64 twins
with the bug). The factors: the embedding raised so the residual stream carries the layers' outputs instead of
being replaced by them; attention and expert outputs brought to the embedding's size; DeepSeek's query projection
shrunk to O(1) attention scores (Qwen3's q/k norms already give that); Qwen3's router sharpened so near ties carry
little weight.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.quantized import DESCRIPTION_FILE, quantize_weights
from ascend_testkit.models.quantized import conditioned as conditioned_by

DOWN_SCALE_BIAS_PARTS = 16
_EXPERT_PROJS = ("gate_proj", "up_proj", "down_proj")
# Factors the float model's tensors are multiplied by before quantizing (the first pattern a tensor name matches wins;
# see the module docstring for why and what was measured). Part of every quantized checkpoint's cache key.
CONDITIONING: dict[str, tuple[tuple[str, float], ...]] = {
    "qwen3": ((r"\.embed_tokens\.weight$", 50.0), (r"\.self_attn\.o_proj\.weight$", 4.0),
              (r"\.mlp\.experts\.\d+\.down_proj\.weight$", 0.5), (r"\.mlp\.gate\.weight$", 3.0)),
    "deepseek": ((r"\.embed_tokens\.weight$", 200.0), (r"\.self_attn\.q_proj\.weight$", 0.006),
                 (r"\.mlp\.experts\.\d+\.down_proj\.weight$", 0.1), (r"\.down_proj\.weight$", 0.2)),
}


def tiny_deepseek_moe_spec():
    """The tiny DeepSeek-V2 MoE the quantized checkpoints start from. `norm_topk_prob` off: transformers'
    DeepSeek-V2 (the float64 reference) never renormalises the top-k weights, vLLM's does when asked."""
    from ascend_testkit.models.deepseek import TinyDeepseekSpec

    return TinyDeepseekSpec(num_layers=3, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=4,
                            topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=False)


@dataclass(frozen=True)
class QuantizedMoeSpec:
    family: str = "qwen3"  # "qwen3" | "deepseek"
    experts: str = "W8A8_DYNAMIC"  # "W8A8_DYNAMIC" | "W4A8_DYNAMIC" | "FLOAT"
    dense: str = "W8A8_DYNAMIC"  # every other quantized linear: "W8A8_DYNAMIC" | "FLOAT"
    fmt: str = "modelslim"  # or "compressed-tensors"
    dtype: str = "bfloat16"

    def key(self) -> str:
        fields = asdict(self) | {"conditioning": CONDITIONING.get(self.family)}
        return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]


def conditioned(family: str, name: str, tensor):
    """`tensor` (the float model's `name`) times its `CONDITIONING` factor, if any."""
    return conditioned_by(CONDITIONING[family], name, tensor)


def float_source(spec: QuantizedMoeSpec, cache_dir: str | os.PathLike | None = None) -> Path:
    """The float checkpoint `spec` quantizes, after `conditioned` (built once into the cache)."""
    if spec.family == "qwen3":
        from ascend_testkit.models.moe import TinyMoeSpec, cached_tiny_qwen3_moe

        return cached_tiny_qwen3_moe(TinyMoeSpec(), cache_dir)
    if spec.family == "deepseek":
        from ascend_testkit.models.deepseek import cached_tiny_deepseek

        return cached_tiny_deepseek(tiny_deepseek_moe_spec(), cache_dir)
    raise ValueError(f"family must be 'qwen3' or 'deepseek', got {spec.family!r}")


def _dense_linear(name: str, family: str) -> bool:
    """Whether `name` (a `.weight` tensor's module) is a quantizable non-expert linear of `family`."""
    if ".mlp.experts." in name or name.endswith(".mlp.gate") or ".layers." not in name:
        return False
    if family == "qwen3":
        return ".self_attn." in name and name.rsplit(".", 1)[-1] in ("q_proj", "k_proj", "v_proj", "o_proj")
    leaf = name.rsplit(".", 1)[-1]
    return leaf in ("q_proj", "kv_a_proj_with_mqa", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize_int4(weight):
    """Per-channel symmetric int4: (values int8 in [-8, 7] [N, K], scale float32 [N])."""
    import torch

    w = weight.to(torch.float64)
    scale = (w.abs().amax(dim=1).clamp(min=1e-8) / 7).to(torch.float32)
    q = torch.round(w / scale.to(torch.float64)[:, None]).clamp(-8, 7).to(torch.int8)
    return q, scale


def pack_int4_rows(q):
    """[N, K] int4 values -> [N / 2, K] int8: row 2j in the low nibble, row 2j + 1 in the high one."""
    import torch

    nibbles = q.to(torch.int16) & 0xF
    return (nibbles[0::2] | (nibbles[1::2] << 4)).to(torch.uint8).view(torch.int8).contiguous()


def _w4a8_tensors(name: str, weight, down: bool) -> dict:
    import torch

    q, scale = quantize_int4(weight)
    n, k = q.shape
    sums = q.to(torch.float64)
    if down:  # K in DOWN_SCALE_BIAS_PARTS partial sums
        sums = sums.view(n, DOWN_SCALE_BIAS_PARTS, k // DOWN_SCALE_BIAS_PARTS).sum(dim=-1)
    else:
        sums = sums.sum(dim=1, keepdim=True)
    return {f"{name}.weight": pack_int4_rows(q), f"{name}.weight_scale": scale.reshape(n, 1),
            f"{name}.weight_offset": torch.zeros(n, 1, dtype=torch.float32),
            f"{name}.scale_bias": (8 * scale.to(torch.float64)[:, None] * sums).to(torch.float32)}


def _w8a8_tensors(name: str, weight, dtype, fmt: str) -> dict:
    import torch

    q, scale = quantize_weights(weight, dtype)
    n = q.shape[0]
    if fmt == "compressed-tensors":
        return {f"{name}.weight": q, f"{name}.weight_scale": scale.reshape(n, 1)}
    return {f"{name}.weight": q, f"{name}.weight_scale": scale.to(dtype).reshape(n, 1),
            f"{name}.weight_offset": torch.zeros(n, 1, dtype=dtype)}


def _ct_config() -> dict:
    weights = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False,
               "group_size": None, "block_structure": None, "actorder": None, "observer": "minmax",
               "observer_kwargs": {}}
    acts = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True,
            "group_size": None, "block_structure": None, "actorder": None, "observer": None, "observer_kwargs": {}}
    return {"quant_method": "compressed-tensors", "format": "int-quantized", "quantization_status": "compressed",
            "global_compression_ratio": None, "ignore": ["lm_head", "re:.*mlp.gate$"], "kv_cache_scheme": None,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": acts,
                                          "output_activations": None}}}


def layer_type(spec: QuantizedMoeSpec, module: str) -> str:
    """The quantization type `spec` gives the module of a `.weight` tensor."""
    if ".mlp.experts." in module:
        return spec.experts
    return spec.dense if _dense_linear(module, spec.family) else "FLOAT"


def build_quantized_moe(path: str | os.PathLike, spec: QuantizedMoeSpec, float_dir: Path) -> Path:
    """Write `spec`'s checkpoint of the float model in `float_dir` to `path`."""
    import torch
    from safetensors.torch import load_file, save_file

    if spec.fmt == "compressed-tensors" and (spec.family, spec.experts, spec.dense) != ("qwen3", "W8A8_DYNAMIC",
                                                                                        "W8A8_DYNAMIC"):
        raise ValueError("the compressed-tensors twin is the qwen3 W8A8_DYNAMIC one")
    dtype = getattr(torch, spec.dtype)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    for item in float_dir.iterdir():
        if item.suffix != ".safetensors" and item.name != "config.json":
            shutil.copy(item, path / item.name)
    tensors = {k: v for f in sorted(float_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    out, description = {}, {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0", "group_size": 0}
    for key, tensor in tensors.items():
        tensor = conditioned(spec.family, key, tensor)
        module = key.removesuffix(".weight")
        kind = layer_type(spec, module) if key.endswith(".weight") else "FLOAT"
        if kind == "FLOAT":
            written = {key: tensor.to(dtype)}
        elif kind == "W8A8_DYNAMIC":
            written = _w8a8_tensors(module, tensor, dtype, spec.fmt)
        elif kind == "W4A8_DYNAMIC":
            written = _w4a8_tensors(module, tensor, down=module.endswith("down_proj"))
        else:
            raise ValueError(f"type {kind!r} for {module}: this quantizer writes FLOAT, W8A8_DYNAMIC, W4A8_DYNAMIC")
        out.update(written)
        description.update(dict.fromkeys(written, kind))
    save_file(out, str(path / "model.safetensors"))
    config = json.loads((float_dir / "config.json").read_text())
    config["torch_dtype"] = spec.dtype
    config.pop("dtype", None)
    if spec.fmt == "compressed-tensors":
        config["quantization_config"] = _ct_config()
    else:
        (path / DESCRIPTION_FILE).write_text(json.dumps(description, indent=1, sort_keys=True))
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def cached_quantized_moe(spec: QuantizedMoeSpec = QuantizedMoeSpec(),
                         cache_dir: str | os.PathLike | None = None) -> Path:
    """`spec`'s checkpoint, built once into the cache (from its float model, also cached)."""
    cache = Path(cache_dir or default_cache_dir())
    float_dir = float_source(spec, cache)
    folder = cache / f"tiny-{spec.family}-moe-{spec.fmt}-{spec.key()}"
    return built_once(folder, lambda tmp: build_quantized_moe(tmp, spec, float_dir))
