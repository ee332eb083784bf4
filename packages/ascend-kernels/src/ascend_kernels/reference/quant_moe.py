"""Reference quantized MoE experts: ModelSlim's int4 packing, the grouped int8 / int4 expert matmul with per-token
scales, and the W8A8 / W4A8 dynamic routed experts built from them.

Layouts are torch_npu's (what the NPU bindings hand `npu_grouped_matmul`): activations `[M, K]` with rows grouped by
expert, weights `[E, K, N]` int8, or `[E, K, N / 2]` int8 holding two int4 values per byte along N (element 2j in
the low nibble, 2j + 1 in the high one: ModelSlim's packing as vllm-ascend reads it). Integer products accumulate
exactly in int32; dequantization is in float32.

The int4 (A8W4) grouped matmul follows the kernel's contract as vllm-ascend drives it: the kernel computes the int8 x
int4 product with the activation shifted by 8 and takes the missing term back through its float `bias`, the
"assist" term ModelSlim writes as `scale_bias` (= 8 x scale x colsum(W) per output channel). The reference computes
the same expression, so a checkpoint whose scale_bias is wrong gives wrong results on both backends alike.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ascend_kernels.reference.quant import _int8_matmul, dynamic_quant

INT4_SHIFT = 8


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int8 `[..., N / 2]` (two signed int4 per byte, low nibble first) -> int8 `[..., N]` in [-8, 7]."""
    u = packed.view(torch.uint8).to(torch.int16)
    low, high = u & 0xF, u >> 4
    pairs = torch.stack([low, high], dim=-1)
    pairs = torch.where(pairs >= 8, pairs - 16, pairs)
    return pairs.flatten(-2).to(torch.int8)


def grouped_quant_matmul(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, pertoken_scale: torch.Tensor,
                         group_list: torch.Tensor, *, int4: bool = False, bias: torch.Tensor | None = None,
                         output_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Rows of x grouped by expert (`group_list`: counts) times each expert's int8 / int4 weight, dequantized per
    output channel and per token; rows past the grouped ones are zeros."""
    m = x.shape[0]
    n = scale.shape[1]
    out = torch.zeros(m, n, dtype=torch.float32, device=x.device)
    start = 0
    for expert, count in enumerate(group_list.tolist()):
        if count == 0:
            continue
        rows = slice(start, start + count)
        w = unpack_int4(weight[expert]) if int4 else weight[expert]
        acc = _int8_matmul(x[rows], w)
        token = pertoken_scale[rows].float().unsqueeze(-1)
        if int4:
            acc = acc - INT4_SHIFT * w.to(torch.int32).sum(dim=0)
            out[rows] = (acc * scale[expert].float() + bias[expert].float()) * token
        else:
            out[rows] = acc * scale[expert].float() * token
        start += count
    return out.to(output_dtype)


def fused_moe_quant(hidden_states, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, *, int4=False,
                    w13_bias=None, w2_bias=None):
    """Dynamic per-token int8 activations through int8 / int4 experts (see `ascend_kernels.ops_quant_moe`)."""
    t, hidden = hidden_states.shape
    out = torch.zeros(t, hidden, dtype=torch.float32, device=hidden_states.device)
    flat_ids = topk_ids.reshape(-1).long()
    pairs = torch.nonzero(flat_ids >= 0).squeeze(1)
    if t == 0 or pairs.numel() == 0:
        return out.to(hidden_states.dtype)
    k = topk_ids.shape[1]
    ids = flat_ids[pairs]
    order = torch.argsort(ids, stable=True)
    pairs = pairs[order]
    tokens = pairs // k
    counts = torch.bincount(ids, minlength=w13.shape[0])
    xq, x_scale = dynamic_quant(hidden_states.index_select(0, tokens))
    gate_up = grouped_quant_matmul(xq, w13, w13_scale, x_scale, counts, int4=int4, bias=w13_bias,
                                   output_dtype=torch.float32)
    inter = gate_up.shape[1] // 2
    act = F.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    aq, a_scale = dynamic_quant(act)
    down = grouped_quant_matmul(aq, w2, w2_scale, a_scale, counts, int4=int4, bias=w2_bias,
                                output_dtype=torch.float32)
    weights = topk_weights.reshape(-1)[pairs].float()
    out.index_add_(0, tokens, down * weights[:, None])
    return out.to(hidden_states.dtype)
