"""transformers' DeepSeek-V3.2 in float64 as the reference of the sparse-attention (SFA) engine tests.

Plain vLLM CPU cannot serve V3.2 (its platform refuses sparse attention), so the engine is compared with the same
forward pass in float64: transformers' `DeepseekV32ForCausalLM` (MLA + lightning indexer), run on the whole sequence
every step. Its indexer scores in full precision; vLLM's (and DeepSeek's own `fp8_index`) scores fp8-quantized
queries and keys, and which keys make the top-k depends on that rounding, so by default the reference quantizes them
the same way (per 128 elements, power-of-two scales, float8_e4m3fn) and keeps everything else transformers'.
"""

from __future__ import annotations


def _fp8_round_trip(x):
    """x through vLLM's indexer quantization (per 128 elements, power-of-two scale, float8_e4m3fn) and back."""
    import torch

    groups = x.unflatten(-1, (-1, 128))
    scale = torch.exp2(torch.ceil(torch.log2(groups.abs().amax(-1, keepdim=True).clamp_min(1e-10) / 448.0)))
    return ((groups / scale).float().to(torch.float8_e4m3fn).to(x.dtype) * scale).flatten(-2)


def _fp8_indexer_forward(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids,
                         past_key_values=None):
    """transformers' DeepseekV32Indexer.forward with its query and key fp8-quantized as vLLM's indexer does (and
    DeepSeek's own fp8_index); everything else (rope, scores, weights, causal mask, top-k) is transformers'."""
    import torch
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import apply_rotary_pos_emb

    b, s, _ = hidden_states.shape
    cos, sin = position_embeddings
    q = self.wq_b(q_resid).view(b, s, self.n_heads, self.head_dim)
    q_rot, q_pass = torch.split(q, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
    k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
    k_rot, k_pass = torch.split(k, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
    q_rot, k_rot = apply_rotary_pos_emb(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
    q = _fp8_round_trip(torch.cat([q_rot, q_pass], dim=-1))
    k = _fp8_round_trip(torch.cat([k_rot, k_pass], dim=-1).squeeze(2))
    scores = torch.relu(torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * self.softmax_scale)
    weights = self.weights_proj(hidden_states) * (self.n_heads ** -0.5)
    index_scores = torch.matmul(weights.unsqueeze(-2), scores).squeeze(-2)
    if attention_mask.dtype == torch.bool:
        index_scores = index_scores.masked_fill(~attention_mask, float("-inf"))
    else:
        index_scores = index_scores + attention_mask
    return index_scores.topk(min(self.index_topk, index_scores.shape[-1]), dim=-1).indices.to(torch.int32)


def float64_v32_outputs(model, prompts: list[str], max_tokens: int, logprobs: int, *, fp8_indexer: bool = True,
                        index_topk: int | None = None) -> list[dict]:
    """Greedy generation with transformers' DeepSeek-V3.2 (MLA + lightning indexer) in float64, the whole sequence
    each step. `fp8_indexer`: the indexer scores fp8-quantized queries and keys as vLLM's does; `index_topk`
    overrides the checkpoint's (a large value makes attention dense)."""
    import contextlib
    from unittest import mock

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.models.deepseek_v32 import modeling_deepseek_v32

    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64, attn_implementation="eager").eval()
    if index_topk is not None:
        for layer in hf.model.layers:
            layer.self_attn.indexer.index_topk = index_topk
    patch = (mock.patch.object(modeling_deepseek_v32.DeepseekV32Indexer, "forward", _fp8_indexer_forward)
             if fp8_indexer else contextlib.nullcontext())
    from ascend_testkit.compare import greedy_float64

    with patch:
        return greedy_float64(hf, tok, prompts, max_tokens, logprobs)

