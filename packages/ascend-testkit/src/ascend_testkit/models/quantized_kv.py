"""ModelSlim's C8 int8 KV cache for the tiny quantized Llamas: per-channel K/V scales calibrated offline, and the
float64 reference of the same quantization.

Calibration (what msModelSlim's KV cache quantizer observes): the keys (after rotary embedding) and values each
attention layer caches, in float64 through transformers over a few prompts; per channel of the flattened
`[num_kv_heads * head_dim]` the min / max range, asymmetric int8: `scale = (max - min) / 255` rounded to the model
dtype, `offset = clamp(round(-128 - min / scale))`. Written as ModelSlim writes them: `<layer>.self_attn.k_proj.
kv_cache_scale`, `.k_proj.kv_cache_offset`, `.v_proj.kv_cache_scale`, `.v_proj.kv_cache_offset`, `[num_kv_heads *
head_dim]` in the model dtype, each described as "C8" beside the global `kv_cache_type: "C8"`.

The reference (`c8_float64_outputs`): transformers in float64 on the checkpoint's own weights, every cached key and
value replaced by its int8 round trip `(clamp(round(x / scale + offset)) - offset) * scale` with the checkpoint's
scales, then eager attention; greedy, recomputing the whole sequence each step. Nothing here calls `ascend_kernels`.
"""

from __future__ import annotations

from pathlib import Path

KV_QUANT_TYPE = "C8"
SCALE_SUFFIXES = ("k_proj.kv_cache_scale", "k_proj.kv_cache_offset", "v_proj.kv_cache_scale", "v_proj.kv_cache_offset")
# Prompt lengths the ranges are observed over: past a 128-token block and the positions the tests generate at.
CALIBRATION_LENGTHS = (9, 64, 129, 240)
_ATTENTION = "ascend_testkit_c8"


def _attention_hook(per_layer):
    """An attention function for transformers' AttentionInterface: `per_layer(layer_idx, key, value) -> (key,
    value)` sees (and may replace) the [B, KV_N, S, D] states a layer caches, then eager attention runs."""
    from transformers.models.llama.modeling_llama import eager_attention_forward

    def attention(module, query, key, value, attention_mask, **kwargs):
        key, value = per_layer(module.layer_idx, key, value)
        return eager_attention_forward(module, query, key, value, attention_mask, **kwargs)

    return attention


def _channels(states):
    """[B, KV_N, S, D] -> [B * S, KV_N * D]: the cache's flattened channels, one row per token."""
    b, n, s, d = states.shape
    return states.permute(0, 2, 1, 3).reshape(b * s, n * d)


def _use(model, per_layer) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    AttentionInterface.register(_ATTENTION, _attention_hook(per_layer))
    # transformers builds no mask for an attention name it has no mask function for: eager attention would then
    # let every position see the whole prompt. The eager mask keeps it causal.
    ALL_MASK_ATTENTION_FUNCTIONS.register(_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["eager"])
    model.set_attn_implementation(_ATTENTION)


def calibrate_kv(float_dir: Path, num_layers: int, prompt_of_length) -> dict[int, tuple]:
    """Per layer, the per-channel (min, max) of the cached keys and of the values: `{layer: (k_lo, k_hi, v_lo,
    v_hi)}` as float64 `[KV_N * D]` tensors (each range holds 0)."""
    import torch
    from transformers import AutoTokenizer, LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(float_dir, dtype=torch.float64).eval()
    tok = AutoTokenizer.from_pretrained(float_dir)
    ranges: dict[int, list] = {}

    def observe(layer, key, value):
        k, v = _channels(key), _channels(value)
        seen = ranges.setdefault(layer, [torch.zeros(k.shape[1], dtype=torch.float64) for _ in range(4)])
        seen[0], seen[1] = torch.minimum(seen[0], k.amin(0)), torch.maximum(seen[1], k.amax(0))
        seen[2], seen[3] = torch.minimum(seen[2], v.amin(0)), torch.maximum(seen[3], v.amax(0))
        return key, value

    _use(model, observe)
    with torch.no_grad():
        for n in CALIBRATION_LENGTHS:
            model(tok(prompt_of_length(n, offset=5 * n), return_tensors="pt")["input_ids"], use_cache=False)
    if sorted(ranges) != list(range(num_layers)):
        raise RuntimeError(f"C8 calibration saw layers {sorted(ranges)}, the model has {num_layers}")
    return {layer: tuple(seen) for layer, seen in ranges.items()}


def channel_params(lo, hi, dtype):
    """Asymmetric per-channel int8 over [lo, hi]: the scale rounded to `dtype`, the integer zero point; both as
    `dtype` tensors (ModelSlim stores them in the model dtype)."""
    import torch

    scale = ((hi - lo).clamp(min=1e-6) / 255).to(dtype)
    offset = torch.round(-128 - lo / scale.double()).clamp(-128, 127)
    return scale, offset.to(dtype)


def c8_tensors(float_dir: Path, num_layers: int, dtype, prompt_of_length) -> dict:
    """The checkpoint's C8 tensors (`model.layers.<i>.self_attn.<k|v>_proj.kv_cache_<scale|offset>`)."""
    out = {}
    for layer, (k_lo, k_hi, v_lo, v_hi) in calibrate_kv(float_dir, num_layers, prompt_of_length).items():
        prefix = f"model.layers.{layer}.self_attn"
        for proj, (lo, hi) in (("k_proj", (k_lo, k_hi)), ("v_proj", (v_lo, v_hi))):
            scale, offset = channel_params(lo, hi, dtype)
            out[f"{prefix}.{proj}.kv_cache_scale"] = scale
            out[f"{prefix}.{proj}.kv_cache_offset"] = offset
    return out


def _round_trip(states, scale, offset):
    import torch

    flat = _channels(states)
    q = torch.round(flat / scale + offset).clamp(-128, 127)
    b, n, s, d = states.shape
    return ((q - offset) * scale).view(b, s, n, d).permute(0, 2, 1, 3)


def load_c8_float64(model_dir: str | Path):
    """transformers' Llama in float64 on the C8 checkpoint's weights, its cached keys and values fake-quantized by
    the checkpoint's own scales and offsets."""
    import torch
    from safetensors.torch import load_file
    from transformers import LlamaForCausalLM

    model_dir = Path(model_dir)
    tensors = {k: v.double() for f in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(str(f)).items()
               if k.endswith(SCALE_SUFFIXES)}
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()

    def fake_quantize(layer, key, value):
        p = f"model.layers.{layer}.self_attn"
        return (_round_trip(key, tensors[f"{p}.k_proj.kv_cache_scale"], tensors[f"{p}.k_proj.kv_cache_offset"]),
                _round_trip(value, tensors[f"{p}.v_proj.kv_cache_scale"], tensors[f"{p}.v_proj.kv_cache_offset"]))

    _use(model, fake_quantize)
    return model


def c8_float64_outputs(model_dir: str | Path, prompts: list[str], max_tokens: int, logprobs: int) -> list[dict]:
    """Greedy float64 generation with the checkpoint's int8 KV round trip, in the engine harness's output format."""
    from transformers import AutoTokenizer

    from ascend_testkit.compare import greedy_float64

    return greedy_float64(load_c8_float64(model_dir), AutoTokenizer.from_pretrained(model_dir), prompts, max_tokens,
                          logprobs)
