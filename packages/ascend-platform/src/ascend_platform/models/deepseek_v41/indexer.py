"""DeepSeek V4.1's lightning indexer on `ascend_kernels`: which compressed entries each query attends to.

Only index-source layers run one; the compressed layers after it reuse the selection it leaves in the model's
shared `topk_indices_buffer` (request-local compressed indices, -1 padded). Unlike V4's, the index keys come from
the KV source's compressor latent (`k_norm(wk(latent))`, RoPE'd at the group position, fp8), written by the KV
source's indexer (`owns_k`) into the index-key cache that later index sources of the same KV source only read.
While no request has more complete entries than `index_topk`, every causal entry is taken without scoring (vLLM's
short-context shortcut); otherwise the query (`wq_b(qr)`, RoPE, fp8) scores every complete key and the best
`index_topk` are kept.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ReplicatedLinear

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.models.deepseek_v41.caches import AscendV41IndexerCache


class AscendDeepseekV41Indexer(nn.Module):
    """vLLM's V4.1 `DeepseekV4Indexer` parameters (`wq_b`, `weights_proj`, and on KV sources `wk`, `k_norm`)."""

    def __init__(self, vllm_config: VllmConfig, *, hidden_size: int, q_lora_rank: int,
                 topk_indices_buffer: torch.Tensor | None, compress_ratio: int, prefix: str, owns_k: bool,
                 k_cache: AscendV41IndexerCache, main_head_dim: int,
                 candidate_block_buffer: torch.Tensor | None = None, candidate_block_size: int = 0,
                 candidate_write: bool = False) -> None:
        super().__init__()
        config = vllm_config.model_config.hf_config
        self.topk_tokens, self.n_head, self.head_dim = config.index_topk, config.index_n_heads, config.index_head_dim
        self.compress_ratio, self.owns_k, self.prefix = compress_ratio, owns_k, prefix
        if topk_indices_buffer is None:
            raise ValueError(f"{prefix}: a V4.1 indexer needs the model's topk_indices_buffer")
        self.topk_indices_buffer = topk_indices_buffer
        self.candidate_block_buffer = candidate_block_buffer
        self.candidate_block_size, self.candidate_write = candidate_block_size, candidate_write
        self.wq_b = ReplicatedLinear(q_lora_rank, self.head_dim * self.n_head, bias=False,
                                     quant_config=vllm_config.quant_config, prefix=f"{prefix}.wq_b")
        self.weights_proj = ReplicatedLinear(hidden_size, self.n_head, bias=False, quant_config=None,
                                             prefix=f"{prefix}.weights_proj")
        self.softmax_scale = self.head_dim ** -0.5
        if owns_k:
            self.wk = ReplicatedLinear(main_head_dim, self.head_dim, bias=False, quant_config=None,
                                       prefix=f"{prefix}.wk")
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_cache = k_cache
        else:
            self._shared_k_cache = (k_cache,)  # another layer's module: not a child of this one

    @property
    def index_cache(self) -> AscendV41IndexerCache:
        return self.k_cache if self.owns_k else self._shared_k_cache[0]

    def produce_k(self, latent: torch.Tensor | None, positions: torch.Tensor, rotary_emb: Any) -> None:
        """The index key of every row closing a group, from the KV source's pre-RoPE latent."""
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict) or latent is None:
            return
        k_pre, _ = self.wk(latent)
        cache = self.index_cache
        kernel_ops().dsv41_indexer_k_norm_rope_store(k_pre, positions, rotary_emb.cos_sin_cache,
                                                     self.k_norm.weight, self.k_norm.variance_epsilon,
                                                     cache.kv_cache, metadata[cache.prefix].slot_mapping,
                                                     self.compress_ratio)

    def forward(self, qr: torch.Tensor, latent: torch.Tensor | None, indexer_weights: torch.Tensor,
                positions: torch.Tensor, rotary_emb: Any) -> None:
        """Write the index keys (KV sources) and leave each token's selection in `topk_indices_buffer`."""
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):
            return
        if self.owns_k:
            self.produce_k(latent, positions, rotary_emb)
        cache = self.index_cache
        m = metadata[cache.prefix]
        n, topk = m.num_actual_tokens, self.topk_tokens
        buffer = self.topk_indices_buffer
        lens = m.compressed_lens[:n]
        if m.max_seq_len // self.compress_ratio <= topk:
            entries = torch.arange(topk, device=lens.device).expand(n, topk)
            buffer[:n, :topk] = torch.where(entries < lens.unsqueeze(-1), entries,
                                            torch.full_like(entries, -1)).to(buffer.dtype)
            usage.count("attention.ascend_dsa_v41.indexer_all_taken", n)
            return
        q = self.wq_b(qr)[0].view(-1, self.n_head, self.head_dim)
        q_fp8 = torch.empty((n, self.n_head, self.head_dim), dtype=torch.float8_e4m3fn, device=q.device)
        weights = torch.empty((n, self.n_head), dtype=torch.float32, device=q.device)
        ops = kernel_ops()
        ops.dsv4_indexer_q_rope_quant(positions[:n], q.float(), rotary_emb.cos_sin_cache, q_fp8,
                                      indexer_weights.float(), self.softmax_scale, self.n_head ** -0.5, weights)
        buffer[:n] = -1
        max_len = int(lens.max()) if n else 0
        if max_len == 0:
            return
        k_cache = cache.kv_cache
        page_table = m.block_table[m.token_to_req_indices[:n].long()]
        logits = ops.dsv4_fp8_paged_mqa_logits(q_fp8, k_cache.view(k_cache.shape[0], -1), weights, lens,
                                               page_table, k_cache.shape[1], max_len)
        logits = self._filter_candidates(logits, lens)
        pages = torch.empty((n, topk), dtype=torch.int32, device=q.device)
        ops.dsv4_topk_transform(logits, lens, page_table, pages, k_cache.shape[1], buffer[:n, :topk])
        usage.count("attention.ascend_dsa_v41.indexed_tokens", n)

    def _filter_candidates(self, logits: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
        """Two-level selection: the candidate source publishes its best `candidate_topk_blocks` blocks of
        `candidate_block_size` entries (row columns are request-local entries, as vLLM's decode rows); later index
        sources keep only the logits inside them. Without a candidate buffer the logits pass unchanged."""
        if self.candidate_block_buffer is None:
            return logits
        n = logits.shape[0]
        candidates = self.candidate_block_buffer[:n]
        ops = kernel_ops()
        if self.candidate_write:
            ops.dsv41_select_candidate_blocks(logits, None, lens, candidates.shape[1], self.candidate_block_size,
                                              candidates)
            return logits
        ops.dsv41_apply_candidate_mask(logits, None, lens, candidates, self.candidate_block_size)
        usage.count("attention.ascend_dsa_v41.candidate_filtered_tokens", n)
        return logits
