"""A tiny MiMo checkpoint (a Qwen2 model whose checkpoint carries its own MTP layer), for `method="mtp"` engines.

MiMo is the smallest family vLLM 0.32 drafts MTP for: a plain Qwen2 decoder (GQA attention, no MLA, no MoE) plus
`model.mtp_layers.N` (`mimo_mtp.py`: token norm, hidden norm, `input_proj` over ``[hidden; token embedding]``, one
Qwen2 decoder layer, final norm; vLLM shares the target's embedding and lm_head with it). The MTP drafter reads the
target's last hidden state at position p and the token at p + 1 and predicts the token at p + 2; vLLM runs that one
layer for every draft step.

Self-draft (`mtp="copy"`): an MTP layer that is exactly the target's computation. The target has ONE decoder layer
attending through a sliding window, and unit-RMS embedding rows. The MTP layer ignores the hidden state
(``input_proj = [0, I]``), so its input is the normalised token embedding, i.e. the target's layer input; its decoder
layer is the target's layer 0 and its final norm the target's final norm. Its own KV cache then holds, at draft
position q - 1, exactly what the target holds at q (RoPE depends on the distance only). Two things keep it from seeing
the same window as the target: the draft never sees the prompt's first token (inputs are shifted by one) and vLLM's
MiMo MTP zeroes the embedding at position 0. A window of W tokens makes both invisible once the prompt has more than
W tokens, so every draft equals the target's greedy token. `mtp="random"`: a random MTP layer (a lossless check).

The folder has no tokenizer: pass the base tiny Llama's as `tokenizer=` (see `mimo_mtp_target`).
"""

from __future__ import annotations

import os
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import is_built
from ascend_testkit.models.drafts import _load, _save, perturbed

MTP_LAYER = "model.mtp_layers.0."
_DECODER_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
                  "mlp.up_proj", "mlp.down_proj", "input_layernorm", "post_attention_layernorm")


def _rope_theta(config: dict) -> float:
    return float(config.get("rope_theta") or (config.get("rope_parameters") or {}).get("rope_theta") or 10000.0)


def mimo_mtp_target(base: str | os.PathLike, out: str | os.PathLike, *, mtp: str, sliding_window: int = 4,
                    seed: int = 2024, noise: float = 0.0) -> Path:
    """A one-layer `MiMoForCausalLM` made from layer 0 of the tiny Llama at `base`, with an MTP layer that copies the
    target (`mtp="copy"`; `noise` > 0 perturbs the copied decoder layer, see `drafts.perturbed`) or is random
    (`mtp="random"`). All variants share the target weights exactly."""
    import torch

    if mtp not in ("copy", "random"):
        raise ValueError(f"mtp must be 'copy' or 'random', got {mtp!r}")
    base, folder = Path(base), Path(out)
    if is_built(folder):
        return folder
    llama, w = _load(base)
    hidden, heads = int(llama["hidden_size"]), int(llama["num_attention_heads"])
    kv_heads = int(llama["num_key_value_heads"])
    head_dim = hidden // heads
    if llama.get("head_dim", head_dim) != head_dim:
        raise ValueError(f"Qwen2 needs head_dim = hidden_size / heads = {head_dim}, the base has {llama['head_dim']}")
    config = {
        "architectures": ["MiMoForCausalLM"],
        "model_type": "qwen2",
        "vocab_size": llama["vocab_size"],
        "hidden_size": hidden,
        "intermediate_size": llama["intermediate_size"],
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "max_position_embeddings": llama["max_position_embeddings"],
        "rms_norm_eps": llama["rms_norm_eps"],
        "rope_parameters": {"rope_theta": _rope_theta(llama), "rope_type": "default"},
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": llama.get("bos_token_id"),
        "eos_token_id": llama.get("eos_token_id"),
        "use_sliding_window": True,
        "sliding_window": sliding_window,
        "max_window_layers": 0,
        "layer_types": ["sliding_attention"],
        "num_nextn_predict_layers": 1,
    }
    emb = w["model.embed_tokens.weight"].float()
    target = {
        "model.embed_tokens.weight": emb / emb.pow(2).mean(-1, keepdim=True).sqrt(),
        "model.norm.weight": w["model.norm.weight"].float(),
        "lm_head.weight": w["lm_head.weight"].float(),
    }
    for part in _DECODER_PARTS:
        target[f"model.layers.0.{part}.weight"] = w[f"model.layers.0.{part}.weight"].float()
    for proj, rows in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim), ("v_proj", kv_heads * head_dim)):
        target[f"model.layers.0.self_attn.{proj}.bias"] = torch.zeros(rows)  # Qwen2 attention has q/k/v biases
    layer = {k.removeprefix("model.layers.0."): v for k, v in target.items() if k.startswith("model.layers.0.")}
    if mtp == "copy":
        head = {
            "input_proj.weight": torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1),
            "token_layernorm.weight": torch.ones(hidden),
            "hidden_layernorm.weight": torch.ones(hidden),
            "final_layernorm.weight": target["model.norm.weight"].clone(),
            **perturbed({k: v.clone() for k, v in layer.items()}, noise, seed),
        }
    else:
        gen = torch.Generator().manual_seed(seed)
        head = {"input_proj.weight": torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5,
                "token_layernorm.weight": torch.ones(hidden), "hidden_layernorm.weight": torch.ones(hidden),
                "final_layernorm.weight": torch.ones(hidden)}
        for k, v in layer.items():
            head[k] = torch.ones_like(v) if k.endswith("layernorm.weight") else (
                torch.zeros_like(v) if k.endswith(".bias") else torch.randn(v.shape, generator=gen))
    mtp_weights = {MTP_LAYER + k: v for k, v in head.items()}
    # No tokenizer files: transformers would load Qwen2's BPE class for a qwen2 model type whatever the copied
    # tokenizer_config says. Engines take the base's word-level tokenizer (`LLM(..., tokenizer=base)`).
    return _save(folder, config, {**target, **mtp_weights}, tokenizer_from=None)
