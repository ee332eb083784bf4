"""npu_grouped_matmul in the MoE form: one x, one [E, K, N] weight, rows grouped by expert (group_type 0) with a
count (group_list_type 1) or cumulative (0) group list, split_item 2/3 (one output). Rows past the grouped ones are
undefined on the card: NaN here.

Three forms are modelled (the wheel's _op_plugin_docs, "group_list输入类型为torch.Tensor" table), computed in float64
independently of `ascend_kernels`' reference:
- float (x, weight and bias float): y = x @ W[e] + b[e];
- per-token int8 (x and weight int8, scale float32 / bfloat16 [E, N], per_token_scale float32 [M], optional int32
  bias, output float16 / bfloat16): y = (x @ W[e] + b[e]) * scale[e] * per_token_scale (the docs' formula 3);
- int8 x int4 (A8W4: weight int32 [E, K, N / 8], eight int4 per word low nibble first, as the wheel's meta function
  sizes it; scale int64 holding float32 bits; a float32 bias [E, N] required; per-token scales). The 2.13 docs do not
  state this form; it is modelled as vllm-ascend drives it: the kernel multiplies the activation shifted by 8 and its
  bias carries the missing term back (the "assist" ModelSlim writes as scale_bias, 8 * scale * colsum(W)),
  y = ((x @ W[e] - 8 * colsum(W[e])) * scale[e] + bias[e]) * per_token_scale: a missing or wrong bias shows.
Anything else (offsets, antiquant, activation inputs, float8 / mx dtypes, act_type) is named unmodelled.
"""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dtype, unmodelled

_OP = "npu_grouped_matmul"
_OUT_DTYPES = {5: torch.float16, 15: torch.bfloat16}
_FLOATS = (torch.float16, torch.bfloat16, torch.float32)


def _int4_values(words: torch.Tensor) -> torch.Tensor:
    """int32 [..., N / 8] -> float64 [..., N]: eight signed int4 per word, lowest nibble first."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    nibbles = (words.to(torch.int64).unsqueeze(-1) >> shifts) & 0xF
    nibbles = torch.where(nibbles >= 8, nibbles - 16, nibbles)
    return nibbles.flatten(-2).double()


def _float_bits(scale: torch.Tensor) -> torch.Tensor:
    return (scale & 0xFFFFFFFF).to(torch.int32).view(torch.float32).double()


def _counts(group_list, group_list_type, experts, rows) -> list[int]:
    if group_list is None or group_list.dim() != 1:
        refuse(_OP, "group_list must be a 1-D tensor with group_type 0")
    require_dtype(_OP, "group_list", group_list, (torch.int64,))
    if group_list_type not in (0, 1):
        refuse(_OP, f"group_list_type must be 0 (cumulative) or 1 (counts), got {group_list_type}")
    if group_list.shape[0] != experts:
        refuse(_OP, f"group_list must have one entry per expert ({experts}), got {group_list.shape[0]}")
    ends = group_list.tolist()
    counts = ends if group_list_type == 1 else [b - a for a, b in zip([0, *ends[:-1]], ends, strict=True)]
    if min(counts, default=0) < 0 or sum(counts) > rows:
        refuse(_OP, f"group_list {ends} (type {group_list_type}) must be non-negative and cover at most the {rows} "
               "rows of x")
    return counts


def _one(name: str, value) -> torch.Tensor | None:
    if value is None:
        return None
    if len(value) != 1:
        unmodelled(_OP, name, f"{len(value)} tensors (one per weight: only one [E, K, N] weight is modelled)")
    return value[0]


def _float_form(a, w, b, experts, n):
    require_dtype(_OP, "x", a, _FLOATS)
    if w.dtype != a.dtype:
        refuse(_OP, f"weight dtype must be x's ({a.dtype}) without quantization, got {w.dtype}")
    if b is not None:
        wanted = torch.float32 if a.dtype == torch.bfloat16 else a.dtype
        if b.shape != (experts, n) or b.dtype != wanted:
            refuse(_OP, f"bias must be [{experts}, {n}] {wanted} for {a.dtype} x, got {tuple(b.shape)} {b.dtype}")
    return w.double(), (lambda e, acc, _t: acc if b is None else acc + b[e].double()), a.dtype


def _quant_form(a, w, b, scale, per_token, output_dtype, experts, n):
    if output_dtype not in _OUT_DTYPES:
        unmodelled(_OP, "output_dtype", output_dtype)
    if per_token is None:
        unmodelled(_OP, "per_token_scale", None)
    require_dtype(_OP, "per_token_scale", per_token, (torch.float32,))
    if per_token.shape != (a.shape[0],):
        refuse(_OP, f"per_token_scale must be [m={a.shape[0]}], got {tuple(per_token.shape)}")
    if scale is None or scale.shape != (experts, n):
        refuse(_OP, f"scale must be [{experts}, {n}], got {None if scale is None else tuple(scale.shape)}")
    if w.dtype == torch.int8:
        require_dtype(_OP, "scale", scale, (torch.float32, torch.bfloat16))
        if b is not None and (b.dtype != torch.int32 or b.shape != (experts, n)):
            refuse(_OP, f"bias of the per-token int8 form must be [{experts}, {n}] int32, got {tuple(b.shape)} "
                        f"{b.dtype}")
        s = scale.double()

        def finish(e, acc, tokens):
            return ((acc if b is None else acc + b[e].double()) * s[e]) * tokens
        return w.double(), finish, _OUT_DTYPES[output_dtype]
    else:  # int32: int4 weights
        require_dtype(_OP, "scale", scale, (torch.int64,))
        if b is None or b.dtype != torch.float32 or b.shape != (experts, n):
            refuse(_OP, f"the int8 x int4 form takes a float32 [{experts}, {n}] bias (the assist term), got "
                        f"{None if b is None else (tuple(b.shape), b.dtype)}")
        s = _float_bits(scale)
        weights = _int4_values(w)
        colsum = weights.sum(dim=1)

        def finish(e, acc, tokens):
            return ((acc - 8 * colsum[e]) * s[e] + b[e].double()) * tokens
        return weights, finish, _OUT_DTYPES[output_dtype]


def npu_grouped_matmul(*, x, weight, bias, scale, offset, antiquant_scale, antiquant_offset, per_token_scale,
                       group_list, activation_input, activation_quant_scale, activation_quant_offset, split_item,
                       group_type, group_list_type, act_type, tuning_config, output_dtype, x_dtype, weight_dtype,
                       scale_dtype, per_token_scale_dtype):
    for name, value in (("offset", offset), ("antiquant_scale", antiquant_scale),
                        ("antiquant_offset", antiquant_offset), ("activation_input", activation_input),
                        ("activation_quant_scale", activation_quant_scale),
                        ("activation_quant_offset", activation_quant_offset), ("x_dtype", x_dtype),
                        ("weight_dtype", weight_dtype), ("scale_dtype", scale_dtype),
                        ("per_token_scale_dtype", per_token_scale_dtype)):
        if value is not None:
            unmodelled(_OP, name, "given")
    if act_type not in (0, None):
        unmodelled(_OP, "act_type", act_type)
    if len(x) != 1 or len(weight) != 1 or weight[0].dim() != 3:
        unmodelled(_OP, "x/weight", f"{len(x)} x and {len(weight)} weights (only one x and one [E, K, N] weight)")
    if split_item not in (2, 3) or group_type != 0:
        unmodelled(_OP, "split_item/group_type", (split_item, group_type))
    a, w = x[0], weight[0]
    b, s, per_token = _one("bias", bias), _one("scale", scale), _one("per_token_scale", per_token_scale)
    experts, k = w.shape[0], w.shape[1]
    n = w.shape[2] * (8 if w.dtype == torch.int32 else 1)
    if a.dim() != 2 or a.shape[1] != k:
        refuse(_OP, f"x must be [M, K={k}] for weight {tuple(w.shape)}, got {tuple(a.shape)}")
    counts = _counts(group_list, group_list_type, experts, a.shape[0])
    if a.dtype == torch.int8:
        if w.dtype not in (torch.int8, torch.int32):
            refuse(_OP, f"an int8 x takes int8 or int4 (int32-packed) weights, got {w.dtype}")
        weights, finish, out_dtype = _quant_form(a, w, b, s, per_token, output_dtype, experts, n)
        tokens = per_token.double()[:, None]
    else:
        for name, value in (("scale", s), ("per_token_scale", per_token), ("output_dtype", output_dtype)):
            if value is not None:
                unmodelled(_OP, name, f"given with {a.dtype} x")
        weights, finish, out_dtype = _float_form(a, w, b, experts, n)
        tokens = torch.ones(a.shape[0], 1, dtype=torch.float64)
    out = torch.full((a.shape[0], n), float("nan"), dtype=out_dtype, device=a.device)
    start = 0
    for expert, count in enumerate(counts):
        if count:
            rows = a[start:start + count].double() @ weights[expert]
            out[start:start + count] = finish(expert, rows, tokens[start:start + count]).to(out_dtype)
            start += count
    return [out]
