"""Tiny DFlash2 and DSpark draft checkpoints (Qwen3 layers, block-parallel drafting) and a target they can match.

DFlash, DFlash2 and DSpark draft a whole block in one parallel pass: the mask slots cannot see the tokens drafted
before them, so no weights make that pass equal an autoregressive target. DFlash2 and DSpark add a sequential stage
that can: DFlash2 walks its top-k candidates left to right, scoring each by an edge from the previous choice
(`candidate_selector`: ``unary + <predecessor_code[prev] * h, successor_code[cand]>``); DSpark samples left to right
with a Markov bias ``markov_w2 @ markov_w1[prev]`` added to its base logits. On a target whose next token depends on
the current token only (a *bigram* target: attention and MLP outputs zeroed, so logits are ``lm_head(norm(e(x)))``),
a draft built from the target's weights makes that stage the target itself:

- `bigram_target`: the tiny Llama with every ``o_proj`` and ``down_proj`` zeroed.
- `dflash2_draft(self_draft=True)`: draft layers that add nothing (``o_proj``/``down_proj`` zero), its own all-zero
  lm_head (unary scores 0, so with ``selector_top_k`` = vocabulary every token is a candidate), a hidden projection
  that maps the mask slots' constant hidden state to ones, ``predecessor_codebook`` = the target embedding and
  ``successor_codebook`` = the target's lm_head with its final norm folded in. The edge score is then the target's
  logit up to a positive factor per predecessor: the walk is the target's greedy chain.
- `dspark_draft(self_draft=True)`: the same backbone and zero lm_head (base logits 0), ``markov_w1`` = the target
  embedding, ``markov_w2`` = the folded lm_head: the Markov bias is the target's logits up to a positive factor.

DFlash1 on the same DFlash2 checkpoint would sample the mask slots' logits, all zero: it would draft token 0 every
time. `self_draft=False` gives random drafts (lossless checks). Weights are written with safetensors, configs are
the target's fields plus what each draft reads.
"""

from __future__ import annotations

import os
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import is_built
from ascend_testkit.models.drafts import _load, _num_layers, _save, perturbed

MASK_TOKEN_ID = 0
CONV_TAPS, CONV_GROUP = 2, 16


def bigram_target(base: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """The tiny Llama at `base` with attention and MLP outputs zeroed: its next token depends on the current one."""
    import torch

    base = Path(base)
    folder = Path(out) if out else base.with_name(base.name + "-bigram")
    if is_built(folder):
        return folder
    config, w = _load(base)
    for key in list(w):
        if key.endswith("self_attn.o_proj.weight") or key.endswith("mlp.down_proj.weight"):
            w[key] = torch.zeros_like(w[key])
    return _save(folder, config, w, tokenizer_from=base)


def _draft_config(tconfig: dict, architecture: str, extra: dict) -> dict:
    hidden = int(tconfig["hidden_size"])
    heads = int(tconfig["num_attention_heads"])
    return {
        "architectures": [architecture],
        "model_type": "qwen3",
        "hidden_size": hidden,
        "intermediate_size": int(tconfig["intermediate_size"]),
        "num_hidden_layers": 1,
        "num_attention_heads": heads,
        "num_key_value_heads": int(tconfig["num_key_value_heads"]),
        "head_dim": int(tconfig.get("head_dim") or hidden // heads),
        "vocab_size": int(tconfig["vocab_size"]),
        "max_position_embeddings": int(tconfig["max_position_embeddings"]),
        "rms_norm_eps": float(tconfig["rms_norm_eps"]),
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "num_target_layers": _num_layers(tconfig),
        **extra,
    }


def _backbone(config: dict, gen, *, silent: bool) -> dict:
    """The Qwen3 draft backbone (fc over the target's layers, one decoder layer); `silent`: the layer adds nothing
    to its input (zero o_proj and down_proj), so a slot's hidden state is its normalised input embedding."""
    import torch

    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen) / shape[-1] ** 0.5

    w = {"fc.weight": rnd(hidden, hidden * config["num_target_layers"]), "hidden_norm.weight": torch.ones(hidden),
         "norm.weight": torch.ones(hidden)}
    p = "layers.0."
    w.update({
        p + "input_layernorm.weight": torch.ones(hidden), p + "post_attention_layernorm.weight": torch.ones(hidden),
        p + "self_attn.q_proj.weight": rnd(heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": rnd(kv_heads * head_dim, hidden),
        p + "self_attn.v_proj.weight": rnd(kv_heads * head_dim, hidden),
        p + "self_attn.o_proj.weight": torch.zeros(hidden, heads * head_dim) if silent else rnd(hidden,
                                                                                                heads * head_dim),
        p + "self_attn.q_norm.weight": torch.ones(head_dim), p + "self_attn.k_norm.weight": torch.ones(head_dim),
        p + "mlp.gate_proj.weight": rnd(inter, hidden), p + "mlp.up_proj.weight": rnd(inter, hidden),
        p + "mlp.down_proj.weight": torch.zeros(hidden, inter) if silent else rnd(hidden, inter),
    })
    return w


def _folded_head(tw: dict):
    """The target's lm_head with its final norm weight folded in: its logits are ``this @ (e / rms(e))``."""
    return tw["lm_head.weight"].float() * tw["model.norm.weight"].float()[None, :]


def _mask_slot_hidden(tconfig: dict, tw: dict):
    """The draft's output at a mask slot when its layer adds nothing: the RMS-normalised mask token embedding."""
    c = tw["model.embed_tokens.weight"][MASK_TOKEN_ID].float()
    return c / (c.pow(2).mean() + float(tconfig["rms_norm_eps"])).sqrt()


def dflash2_draft(target: str | os.PathLike, out: str | os.PathLike, *, self_draft: bool, top_k: int = 8,
                  rank: int = 16, seed: int = 7, noise: float = 0.0) -> Path:
    """A `DFlash2DraftModel` for `target`: matching a bigram target exactly (`self_draft`, see module docstring;
    top-k = the vocabulary, rank = hidden size; `noise` > 0 perturbs its codebooks) or random (`top_k` candidates,
    selector `rank`)."""
    import torch

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    tconfig, tw = _load(target)
    hidden, vocab = int(tconfig["hidden_size"]), int(tconfig["vocab_size"])
    if self_draft:
        top_k, rank = vocab, hidden
    dflash = {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": list(range(_num_layers(tconfig))),
              "conv_kernel_size": CONV_TAPS, "conv_group_size": CONV_GROUP, "selector_rank": rank,
              "selector_top_k": top_k}
    config = _draft_config(tconfig, "DFlash2DraftModel", {"block_size": 4, "dflash_config": dflash})
    gen = torch.Generator().manual_seed(seed)
    w = _backbone(config, gen, silent=self_draft)
    groups = hidden // CONV_GROUP
    for conv in ("attention_conv", "mlp_conv"):
        w[f"layers.0.{conv}.base_kernel"] = torch.randn(2, CONV_TAPS, hidden, generator=gen) * 0.1
        w[f"layers.0.{conv}.kernel_projection.weight"] = torch.randn(2 * CONV_TAPS * groups, hidden,
                                                                     generator=gen) * 0.01
    sel = "candidate_selector."
    if self_draft:
        u = _mask_slot_hidden(tconfig, tw)
        w[sel + "hidden_projection.weight"] = torch.outer(torch.ones(rank), u) / u.dot(u)
        w.update(perturbed({sel + "predecessor_codebook": tw["model.embed_tokens.weight"].float().clone(),
                            sel + "successor_codebook": _folded_head(tw)}, noise, seed))
        w["lm_head.weight"] = torch.zeros(vocab, hidden)  # the draft's own head: every unary score is 0
    else:
        w[sel + "hidden_projection.weight"] = torch.randn(rank, hidden, generator=gen) / hidden**0.5
        w[sel + "predecessor_codebook"] = torch.randn(vocab, rank, generator=gen)
        w[sel + "successor_codebook"] = torch.randn(vocab, rank, generator=gen)
    return _save(folder, config, w, tokenizer_from=target)


def dspark_draft(target: str | os.PathLike, out: str | os.PathLike, *, self_draft: bool, rank: int = 16,
                 seed: int = 11, noise: float = 0.0) -> Path:
    """A `Qwen3DSparkModel` for `target`: matching a bigram target exactly (`self_draft`: Markov rank = hidden size;
    `noise` > 0 perturbs the Markov head) or random (Markov `rank`)."""
    import torch

    target, folder = Path(target), Path(out)
    if is_built(folder):
        return folder
    tconfig, tw = _load(target)
    hidden, vocab = int(tconfig["hidden_size"]), int(tconfig["vocab_size"])
    if self_draft:
        rank = hidden
    dflash = {"mask_token_id": MASK_TOKEN_ID, "target_layer_ids": list(range(_num_layers(tconfig)))}
    config = _draft_config(tconfig, "Qwen3DSparkModel", {"block_size": 3, "markov_rank": rank,
                                                          "dflash_config": dflash})
    gen = torch.Generator().manual_seed(seed)
    w = _backbone(config, gen, silent=self_draft)
    if self_draft:
        w.update(perturbed({"markov_head.markov_w1.weight": tw["model.embed_tokens.weight"].float().clone(),
                            "markov_head.markov_w2.weight": _folded_head(tw)}, noise, seed))
        w["lm_head.weight"] = torch.zeros(vocab, hidden)  # base logits 0: the Markov bias decides
    else:
        w["markov_head.markov_w1.weight"] = torch.randn(vocab, rank, generator=gen)
        w["markov_head.markov_w2.weight"] = torch.randn(vocab, rank, generator=gen) / rank**0.5
    return _save(folder, config, w, tokenizer_from=target)
