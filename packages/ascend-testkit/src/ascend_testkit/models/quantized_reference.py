"""The float64 reference of a compressed-tensors int8 W8A8 checkpoint of the tiny Llama (`models.quantized`): the
anchor that holds on every host.

Plain vLLM CPU serves these checkpoints through oneDNN's int8 GEMM, which is exact only where the host has VNNI: on
an AVX2 host oneDNN multiplies u8 x s8 pairs into saturating int16 sums, and its dynamic per-token outputs were seen
0.21 away (relative to the largest output) from the exact products of the same integers. This reference is
transformers' Llama in float64 with each quantized linear computing exactly what the checkpoint says:
- the weight: its int8 values times its per-channel scale, in float64;
- the input: quantized as the checkpoint's activation scheme does, then dequantized: dynamic per-token symmetric
  (`scale = max|row| / 127`, `q = round(x / scale)`), or static per-tensor with its zero point
  (`q = clamp(round(x / scale + zero_point))`, `x = (q - zero_point) * scale`, as compressed-tensors and vLLM's CPU
  kernel round), each module with its own scale (vLLM merges fused siblings' static scales, q/k/v and gate/up;
  this quantizer calibrates siblings on one input, so they are equal);
- the product in float64, which holds the int32 sum of the integer products exactly.
What it leaves out is the engines' bfloat16 (activations rounded before they are quantized, outputs rounded after):
the comparison's logprob tolerance covers that, as for the other float64 anchors. Greedy, recomputing the whole
sequence each step. Nothing here calls `ascend_kernels` or vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path

INT8_MIN, INT8_MAX = -128, 127


def _quantize_dynamic(x):
    """Per-token (last dimension) symmetric int8 round trip."""
    import torch

    scale = x.abs().amax(dim=-1, keepdim=True) / INT8_MAX
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.round(x / safe).clamp(INT8_MIN, INT8_MAX) * scale


def _quantize_static(x, scale: float, zero_point: float):
    import torch

    return (torch.round(x / scale + zero_point).clamp(INT8_MIN, INT8_MAX) - zero_point) * scale


def _activation_scheme(config: dict, model_dir: Path) -> dict:
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") != "compressed-tensors":
        raise ValueError(f"{model_dir}: config.json's quantization_config is {quant.get('quant_method')!r}, this "
                         "reference reads compressed-tensors int8 W8A8 checkpoints")
    groups = quant["config_groups"]
    schemes = {json.dumps(g["input_activations"], sort_keys=True) for g in groups.values()}
    if len(schemes) != 1:
        raise ValueError(f"one activation scheme expected across config groups, found {len(schemes)}")
    acts = json.loads(schemes.pop())
    if acts.get("num_bits") != 8 or acts.get("type") != "int":
        raise ValueError(f"input activations {acts}: this reference covers int8")
    if acts["dynamic"] and (acts["strategy"] != "token" or not acts["symmetric"]):
        raise ValueError(f"dynamic activations {acts}: this reference covers per-token symmetric")
    if not acts["dynamic"] and acts["strategy"] != "tensor":
        raise ValueError(f"static activations {acts}: this reference covers per-tensor")
    return acts


def load_w8a8_float64(model_dir: str | Path):
    """transformers' Llama in float64 computing the compressed-tensors W8A8 checkpoint in `model_dir` exactly."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    model_dir = Path(model_dir)
    raw = json.loads((model_dir / "config.json").read_text())
    acts = _activation_scheme(raw, model_dir)
    tensors = {k: v for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    quantized = sorted(k.removesuffix(".weight_scale") for k in tensors if k.endswith(".weight_scale"))
    if not quantized:
        raise ValueError(f"{model_dir}: no `.weight_scale` tensors, not an int8 compressed-tensors checkpoint")
    config = LlamaConfig(**{k: v for k, v in raw.items() if k != "quantization_config"})
    model = LlamaForCausalLM(config).to(torch.float64).eval()
    state = {}
    for key, tensor in tensors.items():
        module = key.rsplit(".", 1)[0]
        if module in quantized:
            if key.endswith(".weight"):
                state[key] = tensor.double() * tensors[f"{module}.weight_scale"].double().reshape(-1, 1)
        else:
            state[key] = tensor.double()
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [m for m in missing if m != "lm_head.weight" or not config.tie_word_embeddings]:
        raise ValueError(f"{model_dir}: weights missing {missing}, unexpected {unexpected}")
    if config.tie_word_embeddings:
        model.tie_weights()
    modules = dict(model.named_modules())
    for name in quantized:
        if acts["dynamic"]:
            hook = _dynamic_hook
        else:
            scale = float(tensors[f"{name}.input_scale"].double().reshape(-1)[0])
            zero = float(tensors[f"{name}.input_zero_point"].double().reshape(-1)[0]) \
                if f"{name}.input_zero_point" in tensors else 0.0
            hook = _static_hook(scale, zero)
        modules[name].register_forward_pre_hook(hook)
    return model


def _dynamic_hook(_module, inputs):
    return (_quantize_dynamic(inputs[0]), *inputs[1:])


def _static_hook(scale: float, zero_point: float):
    def hook(_module, inputs):
        return (_quantize_static(inputs[0], scale, zero_point), *inputs[1:])

    return hook


def w8a8_float64_outputs(model_dir: str | Path, prompts: list[str], max_tokens: int, logprobs: int) -> list[dict]:
    """Greedy float64 generation of the W8A8 checkpoint, in the engine harness's output format."""
    from transformers import AutoTokenizer

    from ascend_testkit.compare import greedy_float64

    return greedy_float64(load_w8a8_float64(model_dir), AutoTokenizer.from_pretrained(model_dir), prompts, max_tokens,
                          logprobs)
