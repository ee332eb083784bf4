"""The vision encoder's attention op of the kernel facade: what a multimodal model's vision tower (vLLM's
`MMEncoderAttention`, e.g. Qwen2.5-VL's windowed and full ViT blocks) runs through the Ascend platform.

A vision tower packs every image's patches into one row range and attends within each image (or window) only, with
no causal mask and no KV cache: `cu_seqlens` are the sequences' start offsets, as vLLM's vision models build them.

On an NPU it is `npu_fused_infer_attention_score` over TND q/k/v with the sequences' cumulative lengths and no mask
(the kernel `attention_with_lse` already binds, with the log-sum-exp off), head dims padded to the ones it takes.
vllm-ascend's ViT path calls the ATB op `_npu_flash_attention_unpad` instead; the testkit's schema-faithful torch_npu
gives that op no semantics yet, so it could not be held to torch_npu here, and FIA's TND form takes the same packed
layout.
"""

from __future__ import annotations

import torch

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import NpuBinding, kernel_op
from ascend_kernels.reference import vision as _ref


def check_vision_attention(q, k, v, cu_seqlens, scale, out) -> None:
    op = "vision_attention"
    _v.tensor(op, "q", q, 3, "[num_tokens, num_heads, head_size]")
    _v.floating(op, "q", q, "[num_tokens, num_heads, head_size]")
    t, h, d = q.shape
    _v.tensor(op, "k", k, 3, f"[{t}, num_kv_heads dividing {h}, {d}]")
    if k.shape[0] != t or k.shape[2] != d or k.shape[1] == 0 or h % k.shape[1]:
        _v.fail(op, "k", k, f"[{t}, num_kv_heads dividing {h}, {d}]")
    _v.tensor(op, "v", v, 3, f"[{t}, {k.shape[1]}, head_size_v]")
    if v.shape[:2] != k.shape[:2]:
        _v.fail(op, "v", v, f"[{t}, {k.shape[1]}, head_size_v]")
    for name, x in (("k", k), ("v", v)):
        _v.same_dtype(op, name, x, q.dtype, "a tensor of q's dtype")
        _v.same_device(op, name, x, q.device, "a tensor on q's device")
    _v.start_offsets(op, "cu_seqlens", cu_seqlens, None, q.device)
    _v.number(op, "scale", scale, "a positive real number", positive=True)
    if out is not None and (not isinstance(out, torch.Tensor) or out.shape != (t, h, v.shape[2])
                            or out.dtype != q.dtype):
        _v.fail(op, "out", out, f"[{t}, {h}, {v.shape[2]}] of dtype {q.dtype}")


@kernel_op(validate=check_vision_attention, reference=_ref.vision_attention,
           npu=NpuBinding(target="torch_npu.npu_fused_infer_attention_score", kind="torch_npu",
                          impl="ascend_kernels.npu_vision:vision_attention",
                          note="TND q/k/v (bfloat16, head dims zero-padded to 128/192), the sequences' cumulative "
                               "lengths as actual_seq_lengths(_kv), no mask; empty sequences dropped"))
def vision_attention(q, k, v, cu_seqlens, *, scale: float, out=None, cu_seqlens_host: list[int] | None = None):
    """Non-causal attention within each packed sequence (a vision tower's images or windows), no KV cache.

    q `[num_tokens, num_heads, head_size]`, k `[num_tokens, num_kv_heads, head_size]`, v `[num_tokens, num_kv_heads,
    head_size_v]` (GQA: query head h reads KV head `h // (num_heads // num_kv_heads)`); cu_seqlens int `[S + 1]`:
    sequence s owns rows `cu_seqlens[s] : cu_seqlens[s+1]` (repeated offsets: empty sequences, allowed). Each row
    attends to every row of its own sequence: softmax(scale * q.k) in float32 (float64 for float64 inputs), times v.
    Returns out `[num_tokens, num_heads, head_size_v]` in q's dtype (written into `out` when given); rows outside
    every sequence are 0.
    """
