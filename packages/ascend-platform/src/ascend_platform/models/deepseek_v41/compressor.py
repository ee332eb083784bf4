"""DeepSeek V4.1's compressor on `ascend_kernels`: one latent row per `ratio` tokens of a KV-source layer.

Ratio 1 normalises each token's projection (`compressor.wkv`); ratio 2 pools each closed pair (p - 1, p), p odd,
with a per-dim softmax over the pair's scores (`compressor.wgate`) before the norm. A pair split across two steps
finds its first row in the ring (`AscendV41CompressorStateCache`), where every step leaves its last rows. The latent
is rounded to bf16 on every path, as vLLM's kernel emits it; `insert_cache` RoPEs it at the group's first position
into the compressed cache, and the KV source's indexer derives its index keys from the same pre-RoPE latent.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import MergedColumnParallelLinear

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.models.deepseek_v41.backends import AscendDSAV41CompressorBackend
from ascend_platform.models.deepseek_v41.caches import AscendV41CompressorStateCache


class AscendDeepseekV41Compressor(nn.Module):
    """vLLM's `DeepseekCompressor` parameters (`fused_wkv_wgate`, `norm`) and state cache, on Ascend ops."""

    def __init__(self, vllm_config: VllmConfig, compress_ratio: int, hidden_size: int, head_dim: int, prefix: str,
                 k_cache_prefix: str) -> None:
        super().__init__()
        if compress_ratio not in (1, 2):
            raise NotImplementedError(f"DeepSeek V4.1 compresses at ratio 1 or 2, got {compress_ratio}")
        config = vllm_config.model_config.hf_config
        self.compress_ratio, self.head_dim, self.prefix = compress_ratio, head_dim, prefix
        self._rows_counter = f"attention.ascend_dsa_v41.compressed_rows.ratio{compress_ratio}"
        self.k_cache_prefix = k_cache_prefix
        self.rms_norm_eps = config.rms_norm_eps
        sizes = [head_dim, head_dim] if compress_ratio > 1 else [head_dim]
        self.fused_wkv_wgate = MergedColumnParallelLinear(hidden_size, sizes, bias=False, return_bias=False,
                                                          quant_config=None, disable_tp=True,
                                                          prefix=f"{prefix}.fused_wkv_wgate")
        self.norm = RMSNorm(head_dim, self.rms_norm_eps)
        self.state_cache = (AscendV41CompressorStateCache(state_dim=2 * head_dim, prefix=f"{prefix}.state_cache",
                                                          backend_cls=AscendDSAV41CompressorBackend)
                            if compress_ratio > 1 else None)
        self._static_forward_context = vllm_config.compilation_config.static_forward_context

    def project(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """fp32 `[tokens, ratio * head_dim]` (`[kv | score]` for ratio 2), as vLLM's fp32-output GEMM."""
        weight = self.fused_wkv_wgate.weight
        return torch.nn.functional.linear(hidden_states.float(), weight.float())

    def forward(self, kv_score: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """Save ring rows and return the latent `[tokens, head_dim]` (model dtype, bf16-rounded values), valid at
        the rows closing a group; None on a profile run."""
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):
            return None
        if self.state_cache is None:
            state_cache = query_start_loc = token_to_req = None
            slot_mapping = metadata[self.k_cache_prefix].slot_mapping
        else:
            ring = metadata[self.state_cache.prefix]
            state_cache, slot_mapping = self.state_cache.kv_cache, ring.slot_mapping
            query_start_loc, token_to_req = ring.query_start_loc, ring.token_to_req_indices
        latent = torch.zeros((kv_score.shape[0], self.head_dim), dtype=self.norm.weight.dtype,
                             device=kv_score.device)
        kernel_ops().dsv41_save_compress_norm(kv_score, positions, state_cache, slot_mapping, query_start_loc,
                                              token_to_req, self.norm.weight, self.rms_norm_eps,
                                              self.compress_ratio, latent)
        return latent

    def insert_cache(self, latent: torch.Tensor | None, positions: torch.Tensor, rotary_emb: Any) -> None:
        """RoPE each closing row's latent at its group's first position into the compressed cache."""
        if latent is None:
            return
        metadata = get_forward_context().attn_metadata
        target = metadata[self.k_cache_prefix]
        cache = self._static_forward_context[self.k_cache_prefix].kv_cache
        kernel_ops().dsv41_rope_quant_insert(latent, positions, rotary_emb.cos_sin_cache, cache,
                                             target.slot_mapping, self.compress_ratio)
        usage.count_on_device(self._rows_counter, (target.slot_mapping >= 0)
                              & ((positions[: target.slot_mapping.numel()] + 1) % self.compress_ratio == 0))
