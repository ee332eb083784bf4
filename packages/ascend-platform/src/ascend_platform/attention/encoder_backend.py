"""The Ascend attention backend for encoder-only (non-causal) attention: BERT-style embedding models.

vLLM's `EncoderOnlyAttention` asks the platform for a backend with `attn_type=ENCODER_ONLY`, wraps its metadata
builder so every step's metadata says `causal=False`, and gives the layer no KV cache spec: an encoder layer attends
over the keys and values of its own step only (a pooling request is one whole prompt in one step; vLLM turns chunked
prefill and prefix caching off for non-causal pooling models). So this impl writes nothing and reads no cache: each
request's queries attend to all of that request's keys through the facade's `attention_with_lse` with
`causal=False` (reference: dense softmax attention; NPU: `npu_fused_infer_attention_score` on TND q/k/v with no
mask), the log-sum-exp unused.

It shares the decoder backend's metadata builder (the step's start offsets as host lists once per step) and is not
an `AscendAttentionImpl`: it holds no KV memory, so the KV binding check (`kv_binding.count_ascend_layers_on`)
rightly skips it.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from ascend_platform import usage
from ascend_platform.attention.backend import (
    AscendAttentionBackend,
    AscendAttentionMetadata,
    AscendAttentionMetadataBuilder,
)
from ascend_platform.attention.validation import check_encoder_only_impl_args
from ascend_platform.facade import kernel_ops


class AscendEncoderOnlyAttentionBackend(AscendAttentionBackend):
    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16", "float32"]

    @staticmethod
    def get_name() -> str:
        return "ASCEND_ENCODER_ONLY"

    @staticmethod
    def get_impl_cls() -> type[AscendEncoderOnlyAttentionImpl]:
        return AscendEncoderOnlyAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[AscendAttentionMetadataBuilder]:
        return AscendAttentionMetadataBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return False  # the dense op has no window: ModernBERT's local layers are refused at start-up

    @classmethod
    def supports_sink(cls) -> bool:
        return False

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.ENCODER_ONLY

    @classmethod
    def supports_non_causal(cls) -> bool:
        return True


class AscendEncoderOnlyAttentionImpl(AttentionImpl[AscendAttentionMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.ENCODER_ONLY,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        check_encoder_only_impl_args(
            attn_type=attn_type,
            alibi_slopes=alibi_slopes,
            sliding_window=sliding_window,
            logits_soft_cap=logits_soft_cap,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
            sinks=sinks,
        )
        self.num_heads, self.head_size, self.scale = num_heads, head_size, float(scale)
        self.num_kv_heads = num_kv_heads
        self.attn_type = attn_type

    def do_kv_cache_update(
        self, layer, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        return  # nothing is cached: an encoder layer's keys and values serve only the step that made them

    def forward(
        self,
        layer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AscendAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("ASCEND_ENCODER_ONLY attention: fused output quantization is not supported")
        if attn_metadata is None:  # profiling / dummy run
            return output
        if attn_metadata.causal:  # vLLM's encoder-only builder wrapper makes every step non-causal
            raise RuntimeError("ASCEND_ENCODER_ONLY attention was handed causal metadata")
        m, n = attn_metadata, attn_metadata.num_actual_tokens
        starts = m.query_start_loc
        kernel_ops().attention_with_lse(
            query[:n],
            key[:n],
            value[:n],
            starts,
            starts,
            scale=self.scale,
            causal=False,
            out=output[:n],
            query_start_loc_host=m.query_start_loc_host,
            kv_start_loc_host=m.query_start_loc_host,
        )
        usage.count("attention.ascend.encoder_only.forward")
        return output
