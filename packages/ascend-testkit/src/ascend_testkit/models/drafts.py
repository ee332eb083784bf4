"""Tiny draft checkpoints built from a tiny Llama target, for the acceptance and lossless proofs.

Every speculative method wants its own checkpoint layout; these builders write the smallest checkpoint each method
accepts, offline, next to the target:

- ``draft_model``: a full Llama. The self-draft is the target folder itself; a random draft has fresh weights.
- ``eagle`` (EAGLE-1, ``EagleLlamaForCausalLM``): ``fc`` over ``[embedding; target hidden]`` then decoder layers, no
  final norm, lm_head and embeddings shared with the target. A self-draft needs an *EAGLE-compatible target*: a Llama
  whose embedding rows have unit RMS, whose first input norm and final norm weights are folded into the adjacent
  projections, and whose layers attend through a sliding window. Then ``fc = [I, 0]`` plus the target's own layers
  computes the target's logits up to a positive factor per token (same argmax). The window is what makes that exact:
  EAGLE shifts its inputs by one, so the draft never sees the prompt's first token; with a window the target does
  not see it either once the prompt is longer than the receptive field (layers * (window - 1) + 1 tokens).
- ``dflash`` (``DFlashDraftModel`` on Qwen3 layers): random weights only; a DFlash draft predicts a block in parallel
  from target features, so no weight choice makes it equal the target.

Weights are written with safetensors; configs are the target's config with the fields each method reads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, is_built

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def _load(folder: Path) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    config = json.loads((folder / "config.json").read_text())
    return config, load_file(str(folder / "model.safetensors"))


def _save(folder: Path, config: dict, weights: dict, tokenizer_from: Path | None) -> Path:
    from safetensors.torch import save_file

    def write(tmp: Path) -> None:
        tmp.mkdir(parents=True)
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
        save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"))
        if tokenizer_from is not None:
            for name in TOKENIZER_FILES:
                if (tokenizer_from / name).exists():
                    shutil.copy(tokenizer_from / name, tmp / name)

    return built_once(folder, write)


def _num_layers(config: dict) -> int:
    return int(config["num_hidden_layers"])


def eagle_compatible_target(
    target: str | os.PathLike, out: str | os.PathLike | None = None, *, sliding_window: int = 4
) -> Path:
    """A Llama computing what an EAGLE-1 draft built from its own layers can reproduce (see module docstring).

    Embedding rows are rescaled to unit RMS (so the first input norm is the identity up to eps), the first input norm
    weight is folded into q/k/v, the final norm weight into the lm_head (EAGLE-1 has no final norm; a positive
    per-token scale leaves the argmax unchanged), and every layer attends through `sliding_window` tokens.
    """
    import torch

    target = Path(target)
    folder = Path(out) if out else target.with_name(target.name + f"-eaglecompat-w{sliding_window}")
    if is_built(folder):
        return folder
    config, w = _load(target)
    config["layer_types"] = ["sliding_attention"] * _num_layers(config)
    config["sliding_window"] = sliding_window
    emb = w["model.embed_tokens.weight"].float()
    w["model.embed_tokens.weight"] = emb / emb.pow(2).mean(-1, keepdim=True).sqrt()
    w0 = w["model.layers.0.input_layernorm.weight"].float()
    for proj in ("q_proj", "k_proj", "v_proj"):
        key = f"model.layers.0.self_attn.{proj}.weight"
        w[key] = w[key].float() * w0[None, :]
    w["model.layers.0.input_layernorm.weight"] = torch.ones_like(w0)
    wf = w["model.norm.weight"].float()
    w["lm_head.weight"] = w["lm_head.weight"].float() * wf[None, :]
    w["model.norm.weight"] = torch.ones_like(wf)
    return _save(folder, config, w, tokenizer_from=target)


def perturbed(weights: dict, noise: float, seed: int) -> dict:
    """`weights` with Gaussian noise of `noise` times each matrix's own standard deviation (vectors untouched): a
    self-draft that agrees with its target often but not always, so verification accepts some drafts and rejects
    others within one step."""
    import torch

    if noise <= 0:
        return weights
    gen = torch.Generator().manual_seed(seed)
    return {k: (v + noise * v.float().std() * torch.randn(v.shape, generator=gen)).to(v.dtype) if v.ndim > 1 else v
            for k, v in weights.items()}


def eagle_draft(
    target: str | os.PathLike, out: str | os.PathLike, *, self_draft: bool, seed: int = 1234, noise: float = 0.0
) -> Path:
    """An EAGLE-1 checkpoint for `target`: the target's own layers with ``fc = [I, 0]`` (self_draft) or random weights.

    The self-draft only matches the target when `target` came from `eagle_compatible_target`; `noise` > 0 perturbs
    its decoder layers (see `perturbed`).
    """
    import torch

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    config, tw = _load(target)
    hidden = int(config["hidden_size"])
    # EAGLE-1 replaces the first layer's input norm with the identity, so the checkpoint must not carry it.
    layer_keys = [k for k in tw if k.startswith("model.layers.") and k != "model.layers.0.input_layernorm.weight"]
    draft: dict = {}
    if self_draft:
        draft["fc.weight"] = torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], dim=1)
        layers = perturbed({key.removeprefix("model."): tw[key].clone() for key in layer_keys}, noise, seed)
        draft.update(layers)
    else:
        gen = torch.Generator().manual_seed(seed)
        draft["fc.weight"] = torch.randn(hidden, 2 * hidden, generator=gen) / (2 * hidden) ** 0.5
        for key in layer_keys:
            value = tw[key]
            fresh = torch.ones_like(value) if value.ndim == 1 else torch.randn(value.shape, generator=gen)
            draft[key.removeprefix("model.")] = fresh
    # Draft layers are numbered after the target's; vLLM reads their window from layer_types relative to this.
    config = dict(config, target_layer_count=_num_layers(config))
    return _save(folder, config, draft, tokenizer_from=target)


def random_llama_draft(target: str | os.PathLike, out: str | os.PathLike, *, seed: int = 4321) -> Path:
    """A ``draft_model`` checkpoint: the target's architecture and vocabulary with fresh random weights."""
    import torch

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    config, tw = _load(target)
    gen = torch.Generator().manual_seed(seed)
    fresh = {k: (torch.ones_like(v) if v.ndim == 1 else torch.randn(v.shape, generator=gen)) for k, v in tw.items()}
    return _save(folder, config, fresh, tokenizer_from=target)


def dflash_draft(
    target: str | os.PathLike,
    out: str | os.PathLike,
    *,
    block_size: int = 4,
    num_layers: int = 1,
    seed: int = 99,
) -> Path:
    """A random ``DFlashDraftModel`` (Qwen3 layers) conditioned on the target's hidden states of every layer."""
    import torch

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    tconfig, _ = _load(target)
    hidden = int(tconfig["hidden_size"])
    heads, kv_heads, head_dim = tconfig["num_attention_heads"], tconfig["num_key_value_heads"], tconfig["head_dim"]
    inter = int(tconfig["intermediate_size"])
    target_layers = list(range(_num_layers(tconfig)))
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": tconfig["vocab_size"],
        "max_position_embeddings": tconfig["max_position_embeddings"],
        "rms_norm_eps": tconfig["rms_norm_eps"],
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "block_size": block_size,
        "num_target_layers": len(target_layers),
        "dflash_config": {"mask_token_id": 0, "target_layer_ids": target_layers},
    }
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) / shape[-1] ** 0.5

    w = {
        "fc.weight": rnd(hidden, hidden * len(target_layers)),
        "hidden_norm.weight": torch.ones(hidden),
        "norm.weight": torch.ones(hidden),
    }
    for i in range(num_layers):
        p = f"layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
        w[p + "self_attn.q_proj.weight"] = rnd(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = rnd(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = rnd(kv_heads * head_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = rnd(hidden, heads * head_dim)
        w[p + "self_attn.q_norm.weight"] = torch.ones(head_dim)
        w[p + "self_attn.k_norm.weight"] = torch.ones(head_dim)
        w[p + "mlp.gate_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.up_proj.weight"] = rnd(inter, hidden)
        w[p + "mlp.down_proj.weight"] = rnd(hidden, inter)
    return _save(folder, config, w, tokenizer_from=target)
