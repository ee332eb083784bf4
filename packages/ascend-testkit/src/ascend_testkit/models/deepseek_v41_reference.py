"""An independent float64 forward of DeepSeek V4.1's text model, the reference for tiny V4.1 checkpoints
(`ascend_testkit.models.deepseek_v41`).

No cache: every step recomputes the whole sequence (one prompt at a time), so nothing an engine keeps between steps
can agree with it by accident. Written from vLLM 0.32's V4.1 sources as the spec (transformers 5.19 has no V4.1);
the attention lives in `deepseek_v41_reference_attention`, the engram in `deepseek_v41_reference_engram`, and this
module holds the decoder (paths relative to vllm/):

- delayed mHC (models/deepseek_v41/nvidia/model.py:489-620, model_executor/kernels/mhc/torch.py:6-45
  `mhc_pre_delayed_torch`, `mhc_post_torch`): each sublayer computes post, comb and its own pre from the current
  hc residual as V4 does, but its input collapses the residual with the PREVIOUS sublayer's pre (attention: the
  previous layer's FFN pre; FFN: this layer's attention pre), then the sublayer's RMSNorm. First layer: residual =
  embedding copied to hc_mult streams, its input the raw embedding. After the last layer: norm(sum_j
  pre_lastFFN[j] res[j]) then the head (model.py:1063-1071; V4.1 has no hc_head). hc_post_alpha 2 (model.py:466);
- engram (model.py:531-563): on the full hc residual between the previous layer's post and this layer's pre, on
  layers in engram_layer_ids except layer 0 (which takes the first-layer path and never injects);
- MoE (model.py:123-150, models/deepseek_v4/nvidia/model.py:670-790, model_executor/layers/fused_moe/router/
  cpu_router.py:81-135): V4's MoE with no hash layers: scores sqrt(softplus(gate x)), the top num_experts_per_tok
  of scores + bias, weights = their unbiased scores renormalized times routed_scaling_factor; experts and the
  shared expert SwiGLU with gate clamp(max=swiglu_limit) and up clamp(+-swiglu_limit).

Rounding: by default the reference rounds where vLLM's V4.1 math does on every path (the compressor latent to
bf16; index keys/queries as the fp8 indexer scores them), nothing else; `rounding="none"` computes all in float64;
`latent_bf16=` / `index_fp8=` set either alone (to match an engine that stores one of them otherwise).
Knock-outs for tests: `engram=False`, `candidates=False`, `index_topk=<int>` (a large value makes every compressed
layer dense), `delayed_mhc=False` (plain mHC: each sublayer collapses with its own pre).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ascend_testkit.models.deepseek_v41_reference_attention import (
    Rounding,
    SharedState,
    attention,
    rms_norm,
    topology,
)
from ascend_testkit.models.deepseek_v41_reference_engram import (
    bucket_primes,
    compressed_token_map,
    dequantized_table,
    engram_inject,
    hash_multipliers,
    ngram_rows,
)

HC_POST_ALPHA = 2.0


@dataclass
class Options:
    engram: bool = True
    candidates: bool = True
    index_topk: int | None = None
    delayed_mhc: bool = True
    rounding: str = "vllm"
    latent_bf16: bool | None = None
    """Overrides `rounding` for the compressor latent alone."""
    index_fp8: bool | None = None
    """Overrides `rounding` for the indexer's keys and queries alone."""
    dtype: str = "float64"
    """float32 runs the same math in an engine's precision (to check the checkpoint is tame enough to follow)."""

    def rounding_rule(self) -> Rounding:
        if self.rounding not in ("vllm", "none"):
            raise ValueError(f"rounding must be 'vllm' or 'none', got {self.rounding!r}")
        on = self.rounding == "vllm"
        return Rounding(latent_bf16=on if self.latent_bf16 is None else self.latent_bf16,
                        index_fp8=on if self.index_fp8 is None else self.index_fp8)


class V41Reference:
    """The checkpoint's weights in float64 and the forward over one token sequence."""

    def __init__(self, model_dir: str | os.PathLike, options: Options | None = None):
        import torch
        from safetensors.torch import load_file
        from transformers import AutoTokenizer

        self.config = json.loads(Path(model_dir, "config.json").read_text())["text_config"]
        options = options or Options()
        self.options = options
        self.rounding = options.rounding_rule()
        raw = load_file(str(Path(model_dir, "model.safetensors")))
        dtype = getattr(torch, options.dtype)
        self.w = {k: v.to(dtype) for k, v in raw.items() if not k.endswith("engram.embed.scale")}
        c = self.config
        self.engram_layers = list(c.get("engram_layer_ids") or [])
        for layer in self.engram_layers:
            p = f"layers.{layer}.engram.embed."
            self.w[p + "weight"] = dequantized_table(raw[p + "weight"], raw[p + "scale"]).to(dtype)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        if self.engram_layers:
            self.token_map, size = compressed_token_map(self.tokenizer)
            if size != c["engram_compressed_vocab_size"]:
                raise ValueError(f"compressed vocab {size} != config's {c['engram_compressed_vocab_size']}")
            self.multipliers = hash_multipliers(self.engram_layers, c["engram_max_ngram_size"], size)
            self.primes = bucket_primes(len(self.engram_layers), c["engram_max_ngram_size"], c["engram_n_heads"],
                                        c["engram_vocab_size"])
        self.index_topk = options.index_topk if options.index_topk is not None else c["index_topk"]

    def _mhc_coefficients(self, residual: Any, layer: int, kind: str) -> tuple[Any, Any, Any]:
        """post [T, hc], comb [T, hc, hc], pre [T, hc] of a sublayer from the hc residual [T, hc, H]."""
        import torch

        c, w, hc = self.config, self.w, self.config["hc_mult"]
        p = f"layers.{layer}.hc_{kind}_"
        fn, base, scale = w[p + "fn"], w[p + "base"], w[p + "scale"]
        flat = residual.flatten(1)
        mixes = (flat @ fn.T) * torch.rsqrt(flat.square().mean(-1, keepdim=True) + c["rms_norm_eps"])
        eps = c["hc_eps"]
        pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + eps
        post = torch.sigmoid(mixes[:, hc:2 * hc] * scale[1] + base[hc:2 * hc]) * HC_POST_ALPHA
        comb = mixes[:, 2 * hc:].view(-1, hc, hc) * scale[2] + base[2 * hc:].view(1, hc, hc)
        comb = torch.softmax(comb, dim=-1) + eps
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
        for _ in range(c["hc_sinkhorn_iters"] - 1):
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
            comb = comb / (comb.sum(-2, keepdim=True) + eps)
        return post, comb, pre

    @staticmethod
    def _mhc_post(out: Any, residual: Any, post: Any, comb: Any) -> Any:
        import torch

        return torch.einsum("tij,tih->tjh", comb, residual) + post.unsqueeze(-1) * out.unsqueeze(1)

    def _moe(self, x: Any, layer: int) -> Any:
        import torch

        c, w = self.config, self.w
        p = f"layers.{layer}.ffn."
        limit = c["swiglu_limit"]

        def swiglu(h, w1, w2, w3):
            gate = (h @ w1.T).clamp(max=limit)
            up = (h @ w3.T).clamp(min=-limit, max=limit)
            return (torch.nn.functional.silu(gate) * up) @ w2.T

        scores = torch.sqrt(torch.nn.functional.softplus(x @ w[p + "gate.weight"].T))
        chosen = torch.topk(scores + w[p + "gate.bias"], c["num_experts_per_tok"], dim=-1).indices
        weights = scores.gather(1, chosen)
        weights = weights / weights.sum(-1, keepdim=True) * c["routed_scaling_factor"]
        out = swiglu(x, w[p + "shared_experts.w1.weight"], w[p + "shared_experts.w2.weight"],
                     w[p + "shared_experts.w3.weight"])
        for e in chosen.unique().tolist():
            tokens, slot = (chosen == e).nonzero(as_tuple=True)
            e_p = f"{p}experts.{e}."
            y = swiglu(x[tokens], w[e_p + "w1.weight"], w[e_p + "w2.weight"], w[e_p + "w3.weight"])
            out = out.index_add(0, tokens, y * weights[tokens, slot].unsqueeze(-1))
        return out

    def _engram_rows(self, token_ids: list[int]) -> dict[int, Any]:
        import torch

        c = self.config
        ids = [self.token_map[t] for t in token_ids]
        pad = self.token_map[c["engram_pad_token_id"]]
        return {layer: torch.tensor(ngram_rows(ids, pad, self.multipliers[i], self.primes[i]))
                for i, layer in enumerate(self.engram_layers)}

    def forward(self, token_ids: list[int]) -> Any:
        """Logits [T, vocab] of the sequence."""
        import torch

        c, w, o = self.config, self.w, self.options
        eps = c["rms_norm_eps"]
        engram_rows = self._engram_rows(token_ids) if self.engram_layers and o.engram else {}
        h = w["embed.weight"][torch.tensor(token_ids)]
        residual = h.unsqueeze(1).expand(-1, c["hc_mult"], -1).clone()
        state = SharedState()
        carried_pre = None  # the previous sublayer's pre
        for layer in range(c["num_hidden_layers"]):
            if layer and layer in engram_rows:
                e = f"layers.{layer}.engram."
                residual = engram_inject(residual, engram_rows[layer], w[e + "embed.weight"], w[e + "wkv.weight"],
                                         w[e + "q_weight"], w[e + "k_weight"], eps)
            post, comb, pre = self._mhc_coefficients(residual, layer, "attn")
            collapse = pre if not o.delayed_mhc else carried_pre
            x = h if (layer == 0 and o.delayed_mhc) else (collapse.unsqueeze(-1) * residual).sum(1)
            x = attention(rms_norm(x, w[f"layers.{layer}.attn_norm.weight"], eps), w, c, topology(c, layer), state,
                          self.rounding, index_topk=self.index_topk, candidates=o.candidates)
            residual = self._mhc_post(x, residual, post, comb)
            carried_pre = pre
            post, comb, pre = self._mhc_coefficients(residual, layer, "ffn")
            collapse = pre if not o.delayed_mhc else carried_pre
            x = rms_norm((collapse.unsqueeze(-1) * residual).sum(1), w[f"layers.{layer}.ffn_norm.weight"], eps)
            residual = self._mhc_post(self._moe(x, layer), residual, post, comb)
            carried_pre = pre
        final = rms_norm((carried_pre.unsqueeze(-1) * residual).sum(1), w["norm.weight"], eps)
        return final @ w["head.weight"].T


def float64_v41_outputs(model_dir: str | os.PathLike, prompts: list[str], max_tokens: int, logprobs: int,
                        **options) -> list[dict]:
    """Greedy generation with the float64 V4.1 reference, in the engine harness's output format
    ({token_ids, logprobs: [{token: logprob}]}); `options` are `Options` fields (engram, candidates, index_topk,
    delayed_mhc, rounding, latent_bf16, index_fp8, dtype)."""
    import torch

    from ascend_testkit.compare import one_thread

    ref = V41Reference(model_dir, Options(**options))
    outputs = []
    with torch.no_grad(), one_thread():
        for prompt in prompts:
            ids = ref.tokenizer(prompt).input_ids
            token_ids, tops = [], []
            for _ in range(max_tokens):
                logp = torch.log_softmax(ref.forward(ids)[-1], dim=-1)
                top = torch.topk(logp, logprobs)
                nxt = int(top.indices[0])
                token_ids.append(nxt)
                tops.append({str(int(i)): float(v) for i, v in zip(top.indices, top.values, strict=True)})
                ids = [*ids, nxt]
            outputs.append({"token_ids": token_ids, "logprobs": tops})
    return outputs
