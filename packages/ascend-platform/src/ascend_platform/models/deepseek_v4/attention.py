"""DeepSeek V4's attention layer on `ascend_kernels`: vLLM's CPU V4 layer with every fused op replaced.

vLLM's `DeepseekV4CPUAttention` keeps the layer's structure (projections, the SWA / compressed / indexer caches it
registers, the opaque prepare-and-attend custom op) in eager PyTorch and calls vLLM-CPU C++ kernels for the fused
steps (bf16 only, index_topk 512, AVX512). Here each of those steps calls the `ascend_kernels` op with the same
contract (`dsv4_*`), and the output projection's grouped `wo_a` is a plain batched matmul on the loaded weight.

Cache layout (fp8_ds_mla, as the CPU layer): every SWA and compressed latent row is 448 fp8 NoPE bytes, 64 bf16
RoPE values and 8 UE8M0 scale bytes (584 bytes), in pages of vLLM's KV tensor.
"""

from __future__ import annotations

import functools
from typing import Any, cast

import torch
from vllm.forward_context import get_forward_context
from vllm.models.deepseek_v4.cpu.cpu_sparse import DeepseekV4CPUAttention, _dequant_linear_weight

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.models.deepseek_v4.backends import AscendDSABackend, AscendDSASWABackend
from ascend_platform.models.deepseek_v4.compressor import adopt_compressed_modules
from ascend_platform.models.deepseek_v4.slots import paged_slots, window_positions

_ROPE_DIM = 64



@functools.cache
def _tokens_counter(compress_ratio: int) -> str:
    """The per-ratio token counter's name, built once (every layer counts every step)."""
    return f"attention.ascend_dsa.ratio{compress_ratio}.tokens"

class AscendDeepseekV4Attention(DeepseekV4CPUAttention):
    """One V4 attention layer (sliding window only, or compressed with ratio 4 + indexer, or 128)."""

    backend_cls = AscendDSABackend
    swa_backend_cls = AscendDSASWABackend

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        adopt_compressed_modules(self)

    def _wrap_wo_a_process_weights_after_loading(self) -> None:
        """Keep `wo_a` as `[groups, o_lora_rank, heads_per_group * head_dim]` for the grouped output projection,
        taken right after loading (before its quant method may repack it)."""
        wo_a = self.wo_a
        quant_method = wo_a.quant_method
        original = quant_method.process_weights_after_loading
        k_dim = self.n_local_heads // self.n_local_groups * self.head_dim

        def capture(layer: torch.nn.Module) -> None:
            weight = _dequant_linear_weight(layer).view(self.n_local_groups, self.o_lora_rank, k_dim)
            self._wo_a_grouped = weight.to(layer.weight.dtype if layer.weight.is_floating_point() else torch.float32)
            original(layer)

        quant_method.process_weights_after_loading = capture  # type: ignore[method-assign]

    def _fused_qnorm_rope_kv_insert(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor,
                                    attn_metadata: Any) -> torch.Tensor:
        if not isinstance(attn_metadata, dict):  # profile run: no cache yet, only the padded shape matters
            pad = self.padded_heads - self.n_local_heads
            return torch.nn.functional.pad(q, (0, 0, 0, pad)) if pad else q
        swa = attn_metadata[self.swa_cache_layer.prefix]
        cache = self.swa_cache_layer.kv_cache
        return kernel_ops().dsv4_qnorm_rope_kv_insert(
            q, kv, positions, cache.view(cache.shape[0], -1), swa.slot_mapping, self.rotary_emb.cos_sin_cache,
            self.padded_heads, self.eps, swa.block_size)

    def _o_proj(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if get_forward_context().attn_metadata is None:
            return torch.zeros((o.shape[0], self.hidden_size), dtype=o.dtype, device=o.device)
        num_tokens = o.shape[0]
        # The output is a weighted sum of rows rotated at their own positions: rotating it back by the query's
        # position leaves the position-free quantity wo_a was trained on.
        derotated = kernel_ops().dsv4_inverse_rope_o_proj(o, positions, self.rotary_emb.cos_sin_cache, _ROPE_DIM)
        grouped = derotated.reshape(num_tokens, self.n_local_groups, -1).transpose(0, 1)
        weight = self._wo_a_grouped
        z = torch.bmm(grouped.to(weight.dtype), weight.transpose(1, 2))  # [groups, tokens, o_lora_rank]
        return self.wo_b(z.transpose(0, 1).reshape(num_tokens, -1).to(o.dtype))

    def forward_mqa(self, q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, output: torch.Tensor) -> None:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            output.zero_()
            return
        swa = metadata[self.swa_cache_layer.prefix]
        req_idx = swa.token_to_req_indices
        window_cache = self.swa_cache_layer.kv_cache
        window_cache_2d = window_cache.view(window_cache.shape[0], -1)
        window_slots = paged_slots(window_positions(positions, self.window_size), req_idx, swa.block_table,
                                   swa.block_size)
        if self.compress_ratio <= 1:
            compressed_slots = window_slots.new_full((q.shape[0], 0), -1)
            compressed_cache_2d, compressed_block_size = window_cache_2d, 1
        else:
            compressed = cast(Any, metadata[self.prefix])
            compressed_block_size = compressed.block_size // self.compress_ratio
            compressed_slots = paged_slots(self._compressed_selection(positions, q.shape[0]), req_idx,
                                           compressed.block_table, compressed_block_size)
            compressed_cache_2d = self.kv_cache.view(self.kv_cache.shape[0], -1)
        usage.count(_tokens_counter(self.compress_ratio), q.shape[0])
        kernel_ops().dsv4_sparse_mla_with_kvcache(
            output, q, window_cache_2d, window_slots, swa.block_size, compressed_cache_2d, compressed_slots,
            compressed_block_size, self.attn_sink, self.scale)

    def _compressed_selection(self, positions: torch.Tensor, num_tokens: int) -> torch.Tensor:
        """Per token, the compressed entries (request-local indices, -1 for none) it attends to: the indexer's
        selection for ratio 4; every complete entry so far for ratio 128 (few enough to attend to all)."""
        if self.compress_ratio == 4:
            return self.topk_indices_buffer[:num_tokens]
        width = -(-self.max_model_len // self.compress_ratio)
        complete = torch.div(positions + 1, self.compress_ratio, rounding_mode="floor").clamp(max=width)
        entries = torch.arange(width, device=positions.device).expand(num_tokens, width)
        return torch.where(entries < complete.unsqueeze(-1), entries, torch.full_like(entries, -1))
