"""A tiny EAGLE-3 draft checkpoint for a tiny Llama target, in the layout vLLM's ``llama_eagle3`` model loads.

What vLLM 0.32's `Eagle3LlamaForCausalLM` reads (config, then weights):

- ``architectures: ["LlamaForCausalLMEagle3"]``, a Llama config with ``num_hidden_layers: 1``, the target's
  ``vocab_size``, a smaller ``draft_vocab_size`` (the draft scores only those tokens), ``target_hidden_size`` and
  ``eagle_aux_hidden_state_layer_ids``: which of the target's hidden states the target hands the draft (vLLM
  captures state i before layer i, and the last layer's output as i = num_layers), three of them, concatenated.
- ``fc.weight [hidden, 3 * target_hidden]``: the three target states down to the draft's width.
- ``midlayer.*``: one decoder layer whose q/k/v take ``[embedding; hidden]`` (``2 * hidden`` inputs), with a
  ``hidden_norm`` beside its ``input_layernorm``; ``norm.weight``; ``lm_head.weight [draft_vocab, hidden]``.
- ``d2t [draft_vocab]`` int64: draft id i is target id ``i + d2t[i]``; ``t2d [vocab]`` bool marks those target ids
  (vLLM reads d2t and skips t2d). The embedding is the target's own (copied in, as EAGLE-3 trainers export it).

Weights are random (seeded): such a draft is accepted rarely, which is what a lossless proof needs; it cannot
reproduce the target (its layer sees the target's states only through `fc`, and its vocabulary is a subset).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, is_built

ARCHITECTURE = "LlamaForCausalLMEagle3"
NUM_AUX_STATES = 3


def eagle3_draft(
    target: str | os.PathLike,
    out: str | os.PathLike,
    *,
    draft_vocab_size: int | None = None,
    seed: int = 3,
    std: float = 0.5,
) -> Path:
    """Write (once) a random EAGLE-3 draft for the Llama checkpoint `target` into `out`."""
    import torch
    from safetensors.torch import load_file, save_file

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    config = json.loads((target / "config.json").read_text())
    hidden, vocab, layers = config["hidden_size"], config["vocab_size"], config["num_hidden_layers"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    inter = config["intermediate_size"]
    draft_vocab = draft_vocab_size or vocab // 2
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    # Draft ids map to a sorted random subset of the target's vocabulary (what a trainer keeps: the frequent ones).
    kept = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[kept] = True
    weights = {
        "embed_tokens.weight": load_file(str(target / "model.safetensors"))["model.embed_tokens.weight"].clone(),
        "fc.weight": rnd(hidden, NUM_AUX_STATES * hidden) / NUM_AUX_STATES,
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": rnd(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rnd(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rnd(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rnd(hidden, heads * head_dim),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.mlp.gate_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.up_proj.weight": rnd(inter, hidden),
        "midlayer.mlp.down_proj.weight": rnd(hidden, inter),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": rnd(draft_vocab, hidden),
        "d2t": kept - torch.arange(draft_vocab),
        "t2d": t2d,
    }
    draft_config = {
        **{
            k: config[k]
            for k in (
                "hidden_size",
                "intermediate_size",
                "num_attention_heads",
                "num_key_value_heads",
                "rms_norm_eps",
                "max_position_embeddings",
                "bos_token_id",
                "eos_token_id",
            )
            if k in config
        },
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "head_dim": head_dim,
        "num_hidden_layers": 1,
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": hidden,
        # The embedding (0), between the layers, and the last layer's output: vLLM's capture points of a target
        # this shallow (its default picks layers 2, L/2 and L-3, which a 2-layer Llama does not have).
        "eagle_aux_hidden_state_layer_ids": sorted({0, layers // 2, layers}),
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    if len(draft_config["eagle_aux_hidden_state_layer_ids"]) != NUM_AUX_STATES:
        raise ValueError(
            f"an EAGLE-3 draft takes {NUM_AUX_STATES} distinct target states; {layers} layers give "
            f"{draft_config['eagle_aux_hidden_state_layer_ids']}"
        )

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(draft_config, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))

    return built_once(folder, write)
