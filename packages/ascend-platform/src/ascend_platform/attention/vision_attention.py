"""The Ascend path of a vision encoder's attention: vLLM's `MMEncoderAttention` replaced out of tree.

vLLM's vision towers (Qwen2.5-VL's ViT blocks among others) do not go through the attention backends the platform's
`get_attn_backend_cls` picks: each builds an `MMEncoderAttention`, a `CustomOp` ("mm_encoder_attn") that asks the
platform for a ViT backend enum (`get_vit_attn_backend`; ours keeps the default, TORCH_SDPA, which also keeps the
model's `cu_seqlens` plain offsets) and then dispatches to `forward_oot` on an out-of-tree platform. So the platform
takes the layer over by registering this subclass under the in-tree name (`CustomOp.register_oot`), as it does for
RMSNorm: its `forward_oot` runs the facade's `vision_attention` (reference: per-sequence softmax attention; NPU:
`npu_fused_infer_attention_score` in TND) over the packed images or windows `cu_seqlens` delimits, with no KV cache.

What it does not take runs vLLM's own torch SDPA path and is counted (`attention.ascend.vision.upstream`, with the
reason in the name): keys of another length than the queries (cross attention), and FP8 vision attention.
"""

from __future__ import annotations

import torch

from ascend_platform import usage
from ascend_platform.facade import kernel_ops

_registered = False


def _sequence_offsets(cu_seqlens: torch.Tensor | None, batch: int, length: int) -> list[int]:
    """The packed sequences' start offsets over the flattened `[batch * length]` rows: vLLM's `cu_seqlens` index
    one batch row's positions (repeated for each row); without them each batch row is one sequence."""
    if cu_seqlens is None:
        return [i * length for i in range(batch + 1)]
    starts = [int(x) for x in cu_seqlens.tolist()]
    if batch == 1:
        return starts
    return [0] + [b * length + s for b in range(batch) for s in starts[1:]]


def register_vision_attention() -> bool:
    """Register `AscendMMEncoderAttention` with vLLM (once per process; the worker calls it with the custom ops)."""
    global _registered
    if _registered:
        return False
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.attention.mm_encoder_attention import MMEncoderAttention

    @CustomOp.register_oot(name="MMEncoderAttention")
    class AscendMMEncoderAttention(MMEncoderAttention):
        def forward_oot(self, query, key, value, cu_seqlens=None, max_seqlen=None, sequence_lengths=None):
            bsz, q_len = query.shape[:2]
            kv_len = key.shape[1]
            if kv_len != q_len or getattr(self, "fp8_enabled", False):
                why = "cross" if kv_len != q_len else "fp8"
                usage.count(f"attention.ascend.vision.upstream.{why}")
                return self._forward_sdpa(query, key, value, cu_seqlens)
            is_4d = query.dim() == 4
            q = query.reshape(bsz * q_len, self.num_heads, self.head_size)
            k = key.reshape(bsz * kv_len, self.num_kv_heads, self.head_size)
            v = value.reshape(bsz * kv_len, self.num_kv_heads, self.head_size)
            starts = _sequence_offsets(cu_seqlens, bsz, q_len)
            offsets = torch.tensor(starts, dtype=torch.int32, device=q.device)
            out = kernel_ops().vision_attention(q.contiguous(), k.contiguous(), v.contiguous(), offsets,
                                                scale=self.scale, cu_seqlens_host=starts)
            usage.count("attention.ascend.vision.forward")
            return out.view(bsz, q_len, self.num_heads, self.head_size) if is_4d else out.view(bsz, q_len, -1)

    _registered = True
    return True
