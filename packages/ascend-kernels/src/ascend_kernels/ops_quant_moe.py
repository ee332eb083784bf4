"""Quantized MoE ops of the kernel facade: int4 unpacking, the grouped int8 / int4 expert matmul with per-token
scales, and routed experts with dynamic per-token int8 activations (ModelSlim's W8A8_DYNAMIC and W4A8_DYNAMIC MoE).

Weights are in torch_npu's grouped-matmul layout `[E, K, N]` (the platform transposes a checkpoint's `[N, K]` rows
once, after loading); int4 weights are `[E, K, N / 2]` int8, two values per byte along N, low nibble first.
"""

from __future__ import annotations

import torch

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import NpuBinding, kernel_op, reference_on_device
from ascend_kernels.reference import quant_moe as _ref


def _check_weight(op: str, name: str, w, experts: int | None, k: int, n: int, int4: bool) -> None:
    width = n // 2 if int4 else n
    expected = f"int8 [E, K={k}, {'N/2' if int4 else 'N'}={width}]" + (" (two int4 per byte)" if int4 else "")
    if not isinstance(w, torch.Tensor) or w.dtype != torch.int8 or w.dim() != 3 or tuple(w.shape[1:]) != (k, width):
        _v.fail(op, name, w, expected)
    if experts is not None and w.shape[0] != experts:
        _v.fail(op, name, w, f"{expected} with E={experts}")


def _check_per_expert(op: str, name: str, t, experts: int, n: int, what: str) -> None:
    if (not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or tuple(t.shape) != (experts, n)):
        _v.fail(op, name, t, f"a float32 [E={experts}, N={n}] {what}")


def check_unpack_int4(packed) -> None:
    if not isinstance(packed, torch.Tensor) or packed.dtype != torch.int8 or packed.dim() < 1:
        _v.fail("unpack_int4", "packed", packed, "an int8 tensor [..., N/2] (two int4 values per byte)")


def check_grouped_quant_matmul(x, weight, scale, pertoken_scale, group_list, int4, bias, output_dtype) -> None:
    op = "grouped_quant_matmul"
    _v.tensor(op, "x", x, 2, "[M, K] int8")
    if x.dtype != torch.int8:
        _v.fail(op, "x", x, "[M, K] int8")
    if not isinstance(scale, torch.Tensor) or scale.dim() != 2:
        _v.fail(op, "scale", scale, "a float32 [E, N] per-channel scale")
    experts, n = scale.shape
    _check_per_expert(op, "scale", scale, experts, n, "per-channel scale")
    _check_weight(op, "weight", weight, experts, x.shape[1], n, int4)
    if (not isinstance(pertoken_scale, torch.Tensor) or pertoken_scale.dtype != torch.float32
            or tuple(pertoken_scale.shape) != (x.shape[0],)):
        _v.fail(op, "pertoken_scale", pertoken_scale, f"a float32 [M={x.shape[0]}] per-token scale")
    _v.index(op, "group_list", group_list, 1, f"[E={experts}] int expert row counts")
    if group_list.shape[0] != experts:
        _v.fail(op, "group_list", group_list, f"[E={experts}] int expert row counts")
    if int4:
        _check_per_expert(op, "bias", bias, experts, n, "assist term (int4 weights need it)")
    elif bias is not None:
        _v.fail(op, "bias", bias, "None (int8 weights take no assist term)")
    if output_dtype not in (torch.float32, torch.float16, torch.bfloat16):
        _v.fail(op, "output_dtype", output_dtype, "torch.float32, torch.float16 or torch.bfloat16")


def check_fused_moe_quant(hidden_states, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, int4, w13_bias,
                          w2_bias) -> None:
    op = "fused_moe_quant"
    _v.tensor(op, "hidden_states", hidden_states, 2, "[num_tokens, hidden] float")
    _v.floating(op, "hidden_states", hidden_states, "[num_tokens, hidden]")
    t, hidden = hidden_states.shape
    if not isinstance(w13_scale, torch.Tensor) or w13_scale.dim() != 2 or w13_scale.shape[1] % 2:
        _v.fail(op, "w13_scale", w13_scale, "a float32 [E, 2 * intermediate] per-channel scale")
    experts, n13 = w13_scale.shape
    inter = n13 // 2
    _check_per_expert(op, "w13_scale", w13_scale, experts, n13, "per-channel scale")
    _check_per_expert(op, "w2_scale", w2_scale, experts, hidden, "per-channel scale")
    _check_weight(op, "w13", w13, experts, hidden, n13, int4)
    _check_weight(op, "w2", w2, experts, inter, hidden, int4)
    for name, bias, n in (("w13_bias", w13_bias, n13), ("w2_bias", w2_bias, hidden)):
        if int4:
            _check_per_expert(op, name, bias, experts, n, "assist term (int4 weights need it)")
        elif bias is not None:
            _v.fail(op, name, bias, "None (int8 weights take no assist term)")
    _v.tensor(op, "topk_weights", topk_weights, 2, f"[num_tokens={t}, k] float")
    _v.index(op, "topk_ids", topk_ids, 2, f"[num_tokens={t}, k] int")
    if topk_ids.shape != topk_weights.shape or topk_ids.shape[0] != t:
        _v.fail(op, "topk_ids", topk_ids, f"[num_tokens={t}, k] like topk_weights {tuple(topk_weights.shape)}")


@kernel_op(validate=check_unpack_int4, reference=_ref.unpack_int4, npu=reference_on_device("quant_moe"))
def unpack_int4(packed) -> torch.Tensor:
    """Two signed int4 values per int8 byte, element 2j in the low nibble and 2j + 1 in the high one (ModelSlim's
    W4A8 packing): int8 `[..., N / 2]` -> int8 `[..., N]`, each in [-8, 7]."""


@kernel_op(validate=check_grouped_quant_matmul, reference=_ref.grouped_quant_matmul,
           npu=NpuBinding(target="torch_npu.npu_grouped_matmul", kind="torch_npu",
                          note="per-token int8 x int8 (float32 scale) or int8 x int4 (int32-packed weight, int64 "
                               "scale bits, float32 assist bias); float32 output runs the reference",
                          impl="ascend_kernels.npu_quant_moe:grouped_quant_matmul"))
def grouped_quant_matmul(x, weight, scale, pertoken_scale, group_list, *, int4: bool = False, bias=None,
                         output_dtype=torch.bfloat16) -> torch.Tensor:
    """Grouped expert matmul with per-channel and per-token dequantization.

    x int8 `[M, K]`, rows grouped by expert; group_list int `[E]`: each expert's row count (rows past their sum are
    unspecified: zeros in the reference); weight int8 `[E, K, N]`, or `[E, K, N / 2]` two int4 per byte with int4;
    scale float32 `[E, N]`; pertoken_scale float32 `[M]`. int8: `out = (x @ W[e]) * scale[e] * pertoken`.
    int4 (A8W4, needs bias float32 `[E, N]`, ModelSlim's scale_bias): `out = ((x @ W[e] - 8 * colsum(W[e])) *
    scale[e] + bias[e]) * pertoken`, which is `(x @ W[e]) * scale[e] * pertoken` when bias = 8 * scale * colsum(W).
    Returns `[M, N]` in output_dtype.
    """


@kernel_op(validate=check_fused_moe_quant, reference=_ref.fused_moe_quant,
           npu=NpuBinding(target="torch_npu.npu_moe_init_routing_v2 + npu_dynamic_quant + npu_grouped_matmul + "
                                 "npu_swiglu + npu_moe_token_unpermute", kind="torch_npu",
                          impl="ascend_kernels.npu_quant_moe:fused_moe_quant",
                          note="float16 / bfloat16 activations (float32 runs the reference); count-mode group list"))
def fused_moe_quant(hidden_states, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, *, int4: bool = False,
                    w13_bias=None, w2_bias=None) -> torch.Tensor:
    """Routed SiLU-gated experts with int8 or int4 weights and dynamic per-token int8 activations (W8A8_DYNAMIC /
    W4A8_DYNAMIC MoE); a (token, slot) pair with a negative id is skipped (an expert of another rank).

    hidden_states float `[T, H]`; w13 `[E, H, 2I]` (gate columns then up), w2 `[E, I, H]` in grouped_quant_matmul's
    int8 / int4 layout; w13_scale float32 `[E, 2I]`, w2_scale float32 `[E, H]`; with int4, w13_bias `[E, 2I]` and
    w2_bias `[E, H]` float32 assist terms. For each pair (t, e): x_q, s = dynamic_quant(x[t]); g, u =
    grouped_quant_matmul(x_q, w13[e]) split in halves; a_q, s_a = dynamic_quant(silu(g) * u); y =
    grouped_quant_matmul(a_q, w2[e]); out[t] = sum of topk_weights x y, accumulated in float32, in hidden_states'
    dtype.
    """
