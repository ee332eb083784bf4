"""DeepSeek V4's compressors and lightning indexer on `ascend_kernels`.

A compressed layer's compressor folds every `ratio` tokens' latent rows (scored, overlapping windows for ratio 4)
into one compressed row: each token first saves its partial state, and the token completing a group normalises,
rotates and stores the compressed row. The indexer has its own compressor (128-wide fp8 keys) and scores the
compressed keys per query to pick the `index_topk` the layer attends to. vLLM's CPU classes keep the structure and
call vLLM-CPU kernels; these subclasses call the `ascend_kernels` ops with the same contracts, and point each cache
layer at the Ascend backends (`backends`), which vLLM asks for each KV cache group's metadata builder.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.forward_context import get_forward_context
from vllm.models.deepseek_v4.compressor import CompressorStateCache
from vllm.models.deepseek_v4.cpu.cpu_compressor import DeepseekV4CPUCompressor
from vllm.models.deepseek_v4.cpu.cpu_sparse import DeepseekV4CPUIndexer, DeepseekV4CPUIndexerCache

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.models.deepseek_v4.backends import AscendDSACompressorBackend, AscendDSAIndexerBackend
from ascend_platform.models.deepseek_v4.slots import paged_slots

_STATE_WIDTHS = {512: "dsv4_compress_norm_rope_store", 128: "dsv4_compress_norm_rope_store_indexer"}


class AscendDSACompressorStateCache(CompressorStateCache):
    def get_attn_backend(self) -> type[AscendDSACompressorBackend]:
        return AscendDSACompressorBackend


class AscendDSAIndexerCache(DeepseekV4CPUIndexerCache):
    def get_attn_backend(self) -> type[AscendDSAIndexerBackend]:
        return AscendDSAIndexerBackend


class AscendDeepseekV4Compressor(DeepseekV4CPUCompressor):
    def forward(self, kv_score: torch.Tensor, positions: torch.Tensor, rotary_emb: Any) -> None:
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):
            return
        state = metadata[self.state_cache.prefix]
        num_tokens = state.slot_mapping.shape[0]
        positions = positions[:num_tokens]
        kv, score = kv_score[:num_tokens].split([self.coff * self.head_dim, self.coff * self.head_dim], dim=-1)
        ops = kernel_ops()
        ops.dsv4_save_partial_states(kv, score, self.ape, positions, self.state_cache.kv_cache, state.slot_mapping)
        # The states a completing token folds: its own and the (1 + overlap) * ratio - 1 before it.
        window = (1 + self.overlap) * self.compress_ratio
        covered = positions.unsqueeze(-1) - window + 1 + torch.arange(window, device=positions.device)
        covered = torch.where(covered >= 0, covered, torch.full_like(covered, -1))
        gather_slots = paged_slots(covered, state.token_to_req_indices[:num_tokens], state.block_table,
                                   state.block_size)
        target = metadata[self.k_cache_prefix]
        kv_cache = self._static_forward_context[self.k_cache_prefix].kv_cache
        op = _STATE_WIDTHS[self.head_dim]
        getattr(ops, op)(self.state_cache.kv_cache, gather_slots, positions, target.slot_mapping,
                         self._norm_weight_fp32, self.rms_norm_eps, rotary_emb.cos_sin_cache,
                         kv_cache.view(kv_cache.shape[0], -1), kv_cache.shape[1], self.compress_ratio)


class AscendDeepseekV4Indexer(DeepseekV4CPUIndexer):
    def forward(self, hidden_states: torch.Tensor, qr: torch.Tensor, compressed_kv_score: torch.Tensor | None,
                indexer_weights: torch.Tensor, positions: torch.Tensor, rotary_emb: Any,
                qr_scale: torch.Tensor | None = None, skip_compressor: bool = False):
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, dict):
            indexed = metadata[self.k_cache.prefix]
            if indexed.max_seq_len // self.compress_ratio <= self.topk_tokens:
                # No request has more complete compressed keys than it keeps: each token takes all of its own.
                self.compressor(compressed_kv_score, positions, rotary_emb)
                n = indexed.num_actual_tokens
                entries = torch.arange(self.topk_tokens, device=positions.device).expand(n, -1)
                taken = entries < indexed.compressed_lens[:n].unsqueeze(-1)
                self.topk_indices_buffer[:n, : self.topk_tokens] = torch.where(
                    taken, entries, torch.full_like(entries, -1)).to(self.topk_indices_buffer.dtype)
                usage.count("attention.ascend_dsa.indexer_all_taken", n)
                return None, None, None
        q = self._wq_b_proj(qr, qr_scale).view(-1, self.n_head, self.head_dim)
        q_fp8 = torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device)
        weights = torch.empty(indexer_weights.shape, dtype=torch.float32, device=q.device)
        kernel_ops().dsv4_indexer_q_rope_quant(positions, q.float(), rotary_emb.cos_sin_cache, q_fp8,
                                               indexer_weights.float(), self.softmax_scale, self.n_head ** -0.5,
                                               weights)
        self.compressor(compressed_kv_score, positions, rotary_emb)
        return q_fp8, None, weights


def _adopt_compressor(compressor: Any) -> None:
    compressor.__class__ = AscendDeepseekV4Compressor
    compressor.state_cache.__class__ = AscendDSACompressorStateCache


def adopt_compressed_modules(layer: Any) -> None:
    """Give a V4 attention layer's compressor, indexer and their cache layers the Ascend classes (vLLM's CPU layer
    swaps in its own classes the same way, after construction: the shared base has no class hook)."""
    if layer.compressor is not None:
        _adopt_compressor(layer.compressor)
    if layer.indexer is not None:
        layer.indexer.__class__ = AscendDeepseekV4Indexer
        layer.indexer.k_cache.__class__ = AscendDSAIndexerCache
        _adopt_compressor(layer.indexer.compressor)
