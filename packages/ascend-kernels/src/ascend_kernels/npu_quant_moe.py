"""NPU bindings of the quantized MoE ops (`ascend_kernels.ops_quant_moe`), over torch_npu 2.13.0's kernels:

    npu_grouped_matmul(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, ...,
                       Tensor[]? per_token_scale=None, Tensor? group_list=None, ..., int? split_item=0,
                       int? group_type=None, int? group_list_type=0, ..., int? output_dtype=None, ...) -> Tensor[]
    npu_dynamic_quant(Tensor input, *, ...) -> (Tensor, Tensor)
    npu_moe_init_routing_v2 / npu_swiglu / npu_moe_token_unpermute as `npu_backend.fused_moe` calls them.

Argument conventions follow vllm-ascend's quantized MoE MLP (`quant_apply_mlp`, the unfused path): int8 x int8
per-token with a float32 `[E, N]` scale; int8 x int4 with the weight viewed as int32 (eight int4 per word: the
`[E, K, N / 2]` int8 bytes reinterpreted, no copy), the scale as int64 holding the float32 bits (vllm-ascend's
`_process_scale`) and ModelSlim's scale_bias as the float32 bias. Float32 activations run the reference (the kernel
writes float16 / bfloat16), recorded in `npu_usage` with the reason.
"""

from __future__ import annotations

import torch

from ascend_kernels import npu_usage
from ascend_kernels.npu_backend import _npu
from ascend_kernels.reference import quant_moe as _ref

_DTYPE_ENUM = {torch.float16: 5, torch.bfloat16: 15}


def _int4_words(weight: torch.Tensor) -> torch.Tensor:
    # [E, K, N/2] int8 -> [E, K, N/8] int32: the same bytes, eight int4 values per word, low nibble first.
    return weight.contiguous().view(torch.int32)


def _scale_bits(scale: torch.Tensor) -> torch.Tensor:
    return scale.float().contiguous().view(torch.int32).to(torch.int64) & 0xFFFFFFFF


def _gmm_kwargs(x, weight, scale, pertoken_scale, group_list, int4, bias, output_dtype) -> dict:
    """npu_grouped_matmul's arguments for one grouped quantized matmul (per-token int8, or int8 x int4)."""
    if int4:
        weight, scale, bias = _int4_words(weight), _scale_bits(scale), [bias.float()]
    else:
        scale, bias = scale.float(), None
    return {"x": [x], "weight": [weight], "bias": bias, "scale": [scale], "per_token_scale": [pertoken_scale],
            "group_list": group_list, "split_item": 2, "group_type": 0, "group_list_type": 1,
            "output_dtype": _DTYPE_ENUM[output_dtype]}


def grouped_quant_matmul(x, weight, scale, pertoken_scale, group_list, *, int4=False, bias=None,
                         output_dtype=torch.bfloat16):
    if output_dtype not in _DTYPE_ENUM:
        npu_usage.record_fallback("grouped_quant_matmul", f"output_dtype {output_dtype}: npu_grouped_matmul's "
                                  "quantized forms write float16 / bfloat16")
        return _ref.grouped_quant_matmul(x, weight, scale, pertoken_scale, group_list, int4=int4, bias=bias,
                                         output_dtype=output_dtype)
    return _npu().npu_grouped_matmul(**_gmm_kwargs(x, weight, scale, pertoken_scale, group_list.to(torch.int64), int4,
                                                   bias, output_dtype))[0]


def fused_moe_quant(hidden_states, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, *, int4=False,
                    w13_bias=None, w2_bias=None):
    dtype = hidden_states.dtype
    if dtype not in _DTYPE_ENUM:
        npu_usage.record_fallback("fused_moe_quant", f"hidden_states dtype {dtype}: npu_dynamic_quant takes "
                                  "float16 / bfloat16")
        return _ref.fused_moe_quant(hidden_states, w13, w2, w13_scale, w2_scale, topk_weights, topk_ids, int4=int4,
                                    w13_bias=w13_bias, w2_bias=w2_bias)
    t, k = topk_ids.shape
    if t == 0:
        return hidden_states.new_zeros(hidden_states.shape)
    experts = w13.shape[0]
    # Pairs of experts outside [0, E) (other ranks' experts, id -1) are left out by the active range; the expanded
    # rows past the routed ones are undefined, so they are zeroed before they are quantized.
    expanded_x, row_idx, expert_tokens, _ = _npu().npu_moe_init_routing_v2(
        hidden_states, topk_ids.to(torch.int32), active_num=t * k, expert_num=experts, expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[0, experts])
    routed = (torch.arange(expanded_x.shape[0], device=expanded_x.device) < expert_tokens.sum())[:, None]
    zero = torch.zeros((), dtype=dtype, device=expanded_x.device)
    xq, x_scale = _npu().npu_dynamic_quant(torch.where(routed, expanded_x, zero))
    gate_up = _npu().npu_grouped_matmul(**_gmm_kwargs(xq, w13, w13_scale, x_scale, expert_tokens, int4, w13_bias,
                                                      dtype))[0]
    aq, a_scale = _npu().npu_dynamic_quant(torch.where(routed, _npu().npu_swiglu(gate_up), zero))
    down = _npu().npu_grouped_matmul(**_gmm_kwargs(aq, w2, w2_scale, a_scale, expert_tokens, int4, w2_bias, dtype))[0]
    down = torch.where(routed, down, zero)
    valid = (row_idx >= 0).view(t, k)
    probs = torch.where(valid, topk_weights.to(dtype), zero)
    return _npu().npu_moe_token_unpermute(down, row_idx.clamp(min=0), probs=probs)
