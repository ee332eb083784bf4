"""`AscendDeepseekV41Attention`: one DeepSeek V4.1 attention layer with every fused step on `ascend_kernels`.

Built with the arguments vLLM's V4.1 decoder layer passes (`nvidia/model.py`) and with vLLM's parameter names, so its
weight mapper loads it. What a layer does depends on the config's topology:

- every layer keeps a sliding-window latent cache (`kv_norm(wkv x)`, RoPE'd) and attends over its last
  `sliding_window` rows, plus an attention sink;
- a compressed layer (ratio 1 or 2) also attends over the compressed entries the latest index source at or below it
  selected, read from the compressed cache of the latest KV source at or below it; only KV sources own a compressor
  (and that cache), only index sources run an indexer;
- the query has no per-head norm (`q = wq_b(q_norm(wq_a x))`, then RoPE); compressed layers use the compress RoPE
  (`compress_rope_theta`, YaRN), sliding-window-only layers plain `rope_theta`;
- the output is RoPE'd back by the query's position and projected through the grouped `wo_a`, then `wo_b`.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.distributed import get_tensor_model_parallel_world_size
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.linear import ColumnParallelLinear, MergedColumnParallelLinear, RowParallelLinear
from vllm.model_executor.models.utils import extract_layer_index
from vllm.models.deepseek_v41.common.rope import build_deepseek_v4_rope
from vllm.v1.kv_cache_interface import KVCacheSpec

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.models.deepseek_v4.slots import paged_slots, window_positions
from ascend_platform.models.deepseek_v41.backends import (
    AscendDSAV41Backend,
    AscendDSAV41IndexerBackend,
    AscendDSAV41SWABackend,
)
from ascend_platform.models.deepseek_v41.caches import AscendV41IndexerCache, AscendV41SWACache, compressed_latent_spec
from ascend_platform.models.deepseek_v41.compressor import AscendDeepseekV41Compressor
from ascend_platform.models.deepseek_v41.indexer import AscendDeepseekV41Indexer

_ROPE_DIM = 64


def _layer_prefix(prefix: str, layer_id: int) -> str:
    """`prefix` with its `.layers.<i>.` index replaced by `layer_id` (the same module path in another layer)."""
    new, n = re.subn(r"\.layers\.\d+\.", f".layers.{layer_id}.", prefix)
    if n != 1:
        raise ValueError(f"cannot find the layer index in {prefix!r}")
    return new


class AscendDeepseekV41Attention(nn.Module, AttentionLayerBase):
    def __init__(self, vllm_config: VllmConfig, prefix: str, topk_indices_buffer: torch.Tensor | None = None,
                 aux_stream_list: list[Any] | None = None,
                 candidate_block_buffer: torch.Tensor | None = None) -> None:
        super().__init__()
        del aux_stream_list  # CUDA streams overlap the input GEMMs upstream; one stream here
        config = vllm_config.model_config.hf_config
        tp_size = get_tensor_model_parallel_world_size()
        self.layer_id = layer_id = extract_layer_index(prefix)
        self.prefix = prefix
        self.hidden_size, self.n_heads = config.hidden_size, config.num_attention_heads
        self.n_local_heads = self.n_heads // tp_size
        self.q_lora_rank, self.o_lora_rank = config.q_lora_rank, config.o_lora_rank
        self.head_dim, self.rope_head_dim = config.head_dim, config.qk_rope_head_dim
        self.n_groups = config.o_groups
        self.n_local_groups = self.n_groups // tp_size
        self.window_size = config.sliding_window
        self.eps = config.rms_norm_eps
        self.scale = self.head_dim ** -0.5
        self.max_model_len = vllm_config.model_config.max_model_len
        self._init_topology(config, layer_id)

        self.padded_heads = self.n_local_heads
        self.attn_sink = nn.Parameter(torch.full((self.padded_heads,), -float("inf"), dtype=torch.float32),
                                      requires_grad=False)
        quant_config = vllm_config.quant_config
        self.fused_wqa_wkv = MergedColumnParallelLinear(self.hidden_size, [self.q_lora_rank, self.head_dim],
                                                        bias=False, quant_config=quant_config,
                                                        prefix=f"{prefix}.fused_wqa_wkv", disable_tp=True)
        self.q_norm = RMSNorm(self.q_lora_rank, self.eps)
        self.wq_b = ColumnParallelLinear(self.q_lora_rank, self.n_heads * self.head_dim, bias=False,
                                         quant_config=quant_config, return_bias=False, prefix=f"{prefix}.wq_b")
        self.kv_norm = RMSNorm(self.head_dim, self.eps)
        self.wo_a = ColumnParallelLinear(self.n_heads * self.head_dim // self.n_groups,
                                         self.n_groups * self.o_lora_rank, bias=False, quant_config=quant_config,
                                         return_bias=False, prefix=f"{prefix}.wo_a")
        self.wo_b = RowParallelLinear(self.n_groups * self.o_lora_rank, self.hidden_size, bias=False,
                                      quant_config=quant_config, return_bias=False, prefix=f"{prefix}.wo_b")
        self.rotary_emb = build_deepseek_v4_rope(config, head_dim=self.head_dim, rope_head_dim=self.rope_head_dim,
                                                 max_position_embeddings=config.max_position_embeddings,
                                                 compress_ratio=self.compress_ratio)
        self.topk_indices_buffer = topk_indices_buffer
        self.candidate_block_buffer = candidate_block_buffer

        # Registered before the cache layers so later layers resolve their sources through the forward context.
        context = vllm_config.compilation_config.static_forward_context
        if prefix in context:
            raise ValueError(f"Duplicate layer name: {prefix}")
        context[prefix] = self
        self._static_forward_context = context
        self.kv_cache = torch.tensor([])
        self.model_dtype = vllm_config.model_config.dtype

        self.indexer = self._build_indexer(vllm_config, config) if self.is_index_source else None
        self.swa_cache_layer = AscendV41SWACache(head_dim=self.head_dim, window_size=self.window_size,
                                                 dtype=self.model_dtype, prefix=f"{prefix}.swa_cache",
                                                 cache_config=vllm_config.cache_config,
                                                 backend_cls=AscendDSAV41SWABackend)
        self.compressor = (AscendDeepseekV41Compressor(vllm_config, self.compress_ratio, self.hidden_size,
                                                       self.head_dim, prefix=f"{prefix}.compressor",
                                                       k_cache_prefix=prefix)
                           if self.is_kv_source else None)
        self.compressed_cache_prefix = (_layer_prefix(prefix, self.kv_source_layer_id)
                                        if self.compress_ratio > 0 else None)
        if self.compressed_cache_prefix is not None and self.compressed_cache_prefix not in context:
            raise NotImplementedError(f"{prefix}: its compressed-KV source {self.compressed_cache_prefix} is not "
                                      "on this rank (pipeline splits inside a V4.1 KV-sharing group)")

    def _init_topology(self, config: Any, layer_id: int) -> None:
        ratios = getattr(config, "compress_ratios", None)
        # Layers past the list (MTP) are sliding-window only.
        self.compress_ratio = int(ratios[layer_id]) if ratios is not None and layer_id < len(ratios) else 0
        if self.compress_ratio not in (0, 1, 2):
            raise ValueError(f"DeepSeek V4.1 layer {layer_id} has compress_ratio={self.compress_ratio}; only 0 "
                             "(sliding window), 1 and 2 are supported")
        self._tokens_counter = f"attention.ascend_dsa_v41.ratio{self.compress_ratio}.tokens"
        kv_sources = tuple(getattr(config, "kv_source_layer_ids", None) or ())
        index_sources = tuple(getattr(config, "index_source_layer_ids", None) or ())
        self.candidate_source_layer = getattr(config, "candidate_source_layer_id", -1)
        self.candidate_block_size = getattr(config, "candidate_block_size", 0)
        backbone = layer_id < config.num_hidden_layers
        self.is_kv_source = backbone and layer_id in kv_sources
        self.is_index_source = backbone and layer_id in index_sources
        self.kv_source_layer_id = self.index_source_layer_id = None
        if self.compress_ratio > 0:
            below_kv = [s for s in kv_sources if s <= layer_id]
            below_index = [s for s in index_sources if s <= layer_id]
            if not below_kv or not below_index:
                raise ValueError(f"DeepSeek V4.1 compressed layer {layer_id} (ratio {self.compress_ratio}) has no "
                                 f"KV source ({kv_sources}) or index source ({index_sources}) at or below it")
            self.kv_source_layer_id, self.index_source_layer_id = max(below_kv), max(below_index)

    def _build_indexer(self, vllm_config: VllmConfig, config: Any) -> AscendDeepseekV41Indexer:
        if self.is_kv_source:
            k_cache = AscendV41IndexerCache(prefix=f"{self.prefix}.indexer.k_cache",
                                            cache_config=vllm_config.cache_config,
                                            compress_ratio=self.compress_ratio,
                                            backend_cls=AscendDSAV41IndexerBackend)
        else:
            source = f"{_layer_prefix(self.prefix, self.kv_source_layer_id)}.indexer.k_cache"
            k_cache = self._static_forward_context.get(source)
            if k_cache is None:
                raise NotImplementedError(f"{self.prefix}: index-key cache {source} not found on this rank (is the "
                                          "KV source an index source too?)")
        is_candidate_source = self.layer_id == self.candidate_source_layer
        uses_candidates = 0 <= self.candidate_source_layer < self.layer_id
        return AscendDeepseekV41Indexer(
            vllm_config, hidden_size=self.hidden_size, q_lora_rank=self.q_lora_rank,
            topk_indices_buffer=self.topk_indices_buffer, compress_ratio=self.compress_ratio,
            prefix=f"{self.prefix}.indexer", owns_k=self.is_kv_source, k_cache=k_cache, main_head_dim=self.head_dim,
            candidate_block_buffer=(self.candidate_block_buffer if is_candidate_source or uses_candidates else None),
            candidate_block_size=self.candidate_block_size, candidate_write=is_candidate_source)

    # ------------------------------------------------------------------ KV cache (the compressed latent)

    def bind_kv_cache(self, kv_cache: torch.Tensor) -> None:
        self.kv_cache = kv_cache.squeeze(1)

    def get_attn_backend(self) -> type[AscendDSAV41Backend]:
        return AscendDSAV41Backend

    def get_kv_cache_spec(self, vllm_config: VllmConfig) -> KVCacheSpec | None:
        """Only KV sources own a compressed latent cache; the sliding-window rows are their own cache layer."""
        if not self.is_kv_source:
            return None
        return compressed_latent_spec(vllm_config, head_dim=self.head_dim, dtype=self.model_dtype,
                                      ratio=self.compress_ratio)

    # ------------------------------------------------------------------ forward

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor,
                llama_4_scaling: torch.Tensor | None = None) -> torch.Tensor:
        num_tokens = hidden_states.shape[0]
        qr_kv, _ = self.fused_wqa_wkv(hidden_states)
        qr, kv = qr_kv.split([self.q_lora_rank, self.head_dim], dim=-1)
        qr, kv = self.q_norm(qr.contiguous()), self.kv_norm(kv.contiguous())
        metadata = get_forward_context().attn_metadata
        if not isinstance(metadata, dict):  # profile / dummy run: no caches bound yet, only the shape matters
            return torch.zeros((num_tokens, self.hidden_size), dtype=hidden_states.dtype,
                               device=hidden_states.device)
        swa = metadata[self.swa_cache_layer.prefix]
        q = self.wq_b(qr).view(num_tokens, self.n_local_heads, self.head_dim)
        swa_cache = self.swa_cache_layer.kv_cache
        q = kernel_ops().dsv41_q_rope_kv_insert(q, kv, positions, swa_cache, swa.slot_mapping,
                                                self.rotary_emb.cos_sin_cache, swa.block_size)
        latent = None
        if self.compressor is not None:
            latent = self.compressor(self.compressor.project(hidden_states), positions)
            self.compressor.insert_cache(latent, positions, self.rotary_emb)
        if self.indexer is not None:
            indexer_weights, _ = self.indexer.weights_proj(hidden_states)
            self.indexer(qr, latent, indexer_weights, positions, self.rotary_emb)
        out = torch.zeros_like(q)
        self._attend(q, positions, out, metadata)
        return self._o_proj(out, positions)

    def _attend(self, q: torch.Tensor, positions: torch.Tensor, out: torch.Tensor, metadata: dict) -> None:
        swa = metadata[self.swa_cache_layer.prefix]
        requests = swa.token_to_req_indices
        n = requests.numel()
        positions = positions[:n]
        window_cache = self.swa_cache_layer.kv_cache
        window_slots = paged_slots(window_positions(positions, self.window_size), requests, swa.block_table,
                                   swa.block_size)
        if self.compress_ratio == 0:
            compressed_slots = window_slots.new_full((n, 0), -1)
            compressed_cache, compressed_block_size = window_cache, swa.block_size
        else:
            compressed = metadata[self.compressed_cache_prefix]
            compressed_block_size = compressed.block_size
            compressed_slots = paged_slots(self.topk_indices_buffer[:n], requests, compressed.block_table,
                                           compressed_block_size)
            compressed_cache = self._static_forward_context[self.compressed_cache_prefix].kv_cache
        usage.count(self._tokens_counter, n)
        kernel_ops().dsv4_sparse_mla_with_kvcache(
            out[:n], q[:n], window_cache.view(window_cache.shape[0], -1), window_slots, swa.block_size,
            compressed_cache.view(compressed_cache.shape[0], -1), compressed_slots, compressed_block_size,
            self.attn_sink, self.scale)

    def _o_proj(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        num_tokens = o.shape[0]
        # The output is a weighted sum of rows rotated at their own positions: rotating it back by the query's
        # position leaves the position-free quantity wo_a was trained on.
        derotated = kernel_ops().dsv4_inverse_rope_o_proj(o, positions, self.rotary_emb.cos_sin_cache, _ROPE_DIM)
        grouped = derotated.reshape(num_tokens, self.n_local_groups, -1).transpose(0, 1)
        k_dim = self.n_local_heads // self.n_local_groups * self.head_dim
        weight = self.wo_a.weight.view(self.n_local_groups, self.o_lora_rank, k_dim)
        z = torch.bmm(grouped.to(weight.dtype), weight.transpose(1, 2))  # [groups, tokens, o_lora_rank]
        return self.wo_b(z.transpose(0, 1).reshape(num_tokens, -1).to(o.dtype))
