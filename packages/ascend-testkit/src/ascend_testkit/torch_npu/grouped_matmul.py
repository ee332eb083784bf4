"""npu_grouped_matmul in the MoE form: one x, one [E, K, N] weight, rows grouped by expert (group_type 0) with a
count (group_list_type 1) or cumulative (0) group list, split_item 2/3 (one output). Rows past the grouped ones are
undefined on the card: NaN here."""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype, unmodelled

_OP = "npu_grouped_matmul"


def npu_grouped_matmul(*, x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                       group_list, activation_input, activation_quant_scale, activation_quant_offset, split_item,
                       group_type, group_list_type, act_type, tuning_config, output_dtype, x_dtype, weight_dtype,
                       scale_dtype, per_token_scale_dtype):
    for name, value in (("scale", scale), ("offset", offset), ("antiquant_scale", antiquant_scale),
                        ("antiquant_offset", antiquant_offset), ("per_token_scale", per_token_scale),
                        ("activation_input", activation_input), ("output_dtype", output_dtype),
                        ("x_dtype", x_dtype), ("weight_dtype", weight_dtype)):
        if value is not None:
            unmodelled(_OP, name, "given")
    if act_type not in (0, None):
        unmodelled(_OP, "act_type", act_type)
    if len(x) != 1 or len(weight) != 1 or weight[0].dim() != 3:
        unmodelled(_OP, "x/weight", f"{len(x)} x and {len(weight)} weights (only one x and one [E, K, N] weight)")
    if split_item not in (2, 3) or group_type != 0:
        unmodelled(_OP, "split_item/group_type", (split_item, group_type))
    if group_list is None or group_list.dim() != 1:
        refuse(_OP, "group_list must be a 1-D tensor with group_type 0")
    require_dtype(_OP, "group_list", group_list, (torch.int64,))
    if group_list_type not in (0, 1):
        refuse(_OP, f"group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type}")
    a, w = x[0], weight[0]
    require_dtype(_OP, "x", a, (torch.float16, torch.bfloat16, torch.float32))
    if w.dtype != a.dtype:
        refuse(_OP, f"weight dtype must be x's ({a.dtype}) without quantization, got {w.dtype}")
    experts, k, n = w.shape
    if a.dim() != 2 or a.shape[1] != k:
        refuse(_OP, f"x must be [M, K={k}] for weight {tuple(w.shape)}, got {tuple(a.shape)}")
    if group_list.shape[0] != experts:
        refuse(_OP, f"group_list must have one entry per expert ({experts}), got {group_list.shape[0]}")
    ends = group_list.tolist()
    counts = ends if group_list_type == 1 else [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    if min(counts, default=0) < 0 or sum(counts) > a.shape[0]:
        refuse(_OP, f"group_list {group_list.tolist()} (type {group_list_type}) must be non-negative and cover at "
               f"most the {a.shape[0]} rows of x")
    b = None
    if bias is not None:
        b = bias[0]
        wanted = torch.float32 if a.dtype == torch.bfloat16 else a.dtype
        if b.shape != (experts, n) or b.dtype != wanted:
            refuse(_OP, f"bias must be [{experts}, {n}] {wanted} for {a.dtype} x, got {tuple(b.shape)} {b.dtype}")
    out = torch.full((a.shape[0], n), float("nan"), dtype=a.dtype, device=a.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            rows = a[start:start + count].float() @ w[expert].float()
            if b is not None:
                rows = rows + b[expert].float()
            out[start:start + count] = rows.to(a.dtype)
            start += count
    return [out]
