"""npu_fused_infer_attention_score(_v2)(.out): the schema's keyword names and defaults, mapped onto FiaCall.

The parameter lists are torch_npu 2.13's schemas verbatim (libtorch_npu.so); a test compares them. _v2's KV
antiquant (dequant_scale/offset_key/value with key/value_quant_mode) is modelled (antiquant.py); the other arguments
for quantization, pse, shared prefixes and left padding are accepted by the card but not modelled here: any of them
given raises NotImplementedError naming it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ascend_testkit.torch_npu.attention.antiquant import AntiquantArgs
from ascend_testkit.torch_npu.attention.fia_core import FiaCall, run_fia
from ascend_testkit.torch_npu.attention.limits import CardLimits
from ascend_testkit.torch_npu.attention.refusals import refuse, require_contiguous, unmodelled

INT_MAX = 2147483647

V1_UNMODELLED_TENSORS = (
    "pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
    "antiquant_scale", "antiquant_offset", "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
    "value_antiquant_offset", "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
    "actual_shared_prefix_len", "key_rope_antiquant_scale",
)
V1_UNMODELLED_MODES = ("antiquant_mode", "key_antiquant_mode", "value_antiquant_mode")
V2_UNMODELLED_TENSORS = (
    "pse_shift", "dequant_scale_query", "dequant_scale_key_rope", "quant_scale_out", "quant_offset_out",
    "quant_scale_p", "query_dtype", "key_dtype", "value_dtype", "query_rope_dtype", "key_rope_dtype",
    "key_shared_prefix_dtype", "value_shared_prefix_dtype", "dequant_scale_query_dtype", "dequant_scale_key_dtype",
    "dequant_scale_value_dtype", "dequant_scale_key_rope_dtype", "out_dtype",
)
V2_UNMODELLED_MODES = ("query_quant_mode",)  # key/value_quant_mode: antiquant.py


def _reject_unmodelled(op: str, args: dict, tensors: tuple[str, ...], modes: tuple[str, ...]) -> None:
    for name in tensors:
        if args[name] is not None:
            unmodelled(op, name, "given")
    for name in modes:
        if args[name] != 0:
            unmodelled(op, name, args[name])


def _v1_call(args: dict) -> FiaCall:
    return FiaCall(
        api="v1", query=args["query"], key=args["key"], value=args["value"], query_rope=args["query_rope"],
        key_rope=args["key_rope"], atten_mask=args["atten_mask"], block_table=args["block_table"],
        block_size=args["block_size"], q_lengths=args["actual_seq_lengths"],
        kv_lengths=args["actual_seq_lengths_kv"], num_heads=args["num_heads"],
        num_kv_heads=args["num_key_value_heads"], scale=args["scale"], pre_tokens=args["pre_tokens"],
        next_tokens=args["next_tokens"], input_layout=args["input_layout"], sparse_mode=args["sparse_mode"],
        inner_precise=args["inner_precise"], return_lse=args["softmax_lse_flag"])


def _v2_call(args: dict) -> FiaCall:
    return FiaCall(
        api="v2", query=args["query"], key=args["key"], value=args["value"], query_rope=args["query_rope"],
        key_rope=args["key_rope"], atten_mask=args["atten_mask"], block_table=args["block_table"],
        block_size=args["block_size"], q_lengths=args["actual_seq_qlen"], kv_lengths=args["actual_seq_kvlen"],
        num_heads=args["num_query_heads"], num_kv_heads=args["num_key_value_heads"], scale=args["softmax_scale"],
        pre_tokens=args["pre_tokens"], next_tokens=args["next_tokens"], input_layout=args["input_layout"],
        sparse_mode=args["sparse_mode"], inner_precise=args["inner_precise"],
        return_lse=args["return_softmax_lse"], learnable_sink=args["learnable_sink"],
        antiquant=AntiquantArgs(key_scale=args["dequant_scale_key"], key_offset=args["dequant_offset_key"],
                                value_scale=args["dequant_scale_value"], value_offset=args["dequant_offset_value"],
                                key_mode=args["key_quant_mode"], value_mode=args["value_quant_mode"]))


def _write_out(op: str, out: list[torch.Tensor], results: tuple[torch.Tensor, torch.Tensor],
               lse_requested: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if len(out) != 2:
        refuse(op, f"out must be [attention_out, softmax_lse], got {len(out)} tensors")
    attention_out, lse = results
    targets = [(0, attention_out)] + ([(1, lse)] if lse_requested else [])
    for index, result in targets:
        target = out[index]
        require_contiguous(op, f"out[{index}]", target)
        if target.shape != result.shape or target.dtype != result.dtype:
            refuse(op, f"out[{index}] must be {tuple(result.shape)} {result.dtype}, got {tuple(target.shape)} "
                   f"{target.dtype}")
        target.copy_(result)
    return out[0], out[1]


def make_fia_ops(limits: CardLimits) -> dict[str, Callable]:
    def npu_fused_infer_attention_score(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
        dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None, quant_offset2=None,
        antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
        value_antiquant_scale=None, value_antiquant_offset=None, block_table=None, query_padding_size=None,
        kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None,
        query_rope=None, key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
        pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
        softmax_lse_flag=False,
    ):
        args = dict(locals())
        op = "npu_fused_infer_attention_score"
        _reject_unmodelled(op, args, V1_UNMODELLED_TENSORS, V1_UNMODELLED_MODES)
        return run_fia(op, _v1_call(args), limits)

    def npu_fused_infer_attention_score_out(
        query, key, value, *, pse_shift=None, atten_mask=None, actual_seq_lengths=None, actual_seq_lengths_kv=None,
        dequant_scale1=None, quant_scale1=None, dequant_scale2=None, quant_scale2=None, quant_offset2=None,
        antiquant_scale=None, antiquant_offset=None, key_antiquant_scale=None, key_antiquant_offset=None,
        value_antiquant_scale=None, value_antiquant_offset=None, block_table=None, query_padding_size=None,
        kv_padding_size=None, key_shared_prefix=None, value_shared_prefix=None, actual_shared_prefix_len=None,
        query_rope=None, key_rope=None, key_rope_antiquant_scale=None, num_heads=1, scale=1.0,
        pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH", num_key_value_heads=0, sparse_mode=0,
        inner_precise=0, block_size=0, antiquant_mode=0, key_antiquant_mode=0, value_antiquant_mode=0,
        softmax_lse_flag=False, workspace=None, out,
    ):
        args = dict(locals())
        op = "npu_fused_infer_attention_score.out"
        _reject_unmodelled(op, args, V1_UNMODELLED_TENSORS, V1_UNMODELLED_MODES)
        return _write_out(op, out, run_fia(op, _v1_call(args), limits), softmax_lse_flag)

    def npu_fused_infer_attention_score_v2(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None, actual_seq_qlen=None,
        actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
        dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
        quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
        sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
        key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
        dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None,
    ):
        args = dict(locals())
        op = "npu_fused_infer_attention_score_v2"
        _reject_unmodelled(op, args, V2_UNMODELLED_TENSORS, V2_UNMODELLED_MODES)
        return run_fia(op, _v2_call(args), limits)

    def npu_fused_infer_attention_score_v2_out(
        query, key, value, *, query_rope=None, key_rope=None, pse_shift=None, atten_mask=None, actual_seq_qlen=None,
        actual_seq_kvlen=None, block_table=None, dequant_scale_query=None, dequant_scale_key=None,
        dequant_offset_key=None, dequant_scale_value=None, dequant_offset_value=None, dequant_scale_key_rope=None,
        quant_scale_out=None, quant_offset_out=None, quant_scale_p=None, learnable_sink=None, num_query_heads=1,
        num_key_value_heads=0, softmax_scale=1.0, pre_tokens=INT_MAX, next_tokens=INT_MAX, input_layout="BSH",
        sparse_mode=0, block_size=0, query_quant_mode=0, key_quant_mode=0, value_quant_mode=0, inner_precise=0,
        return_softmax_lse=False, query_dtype=None, key_dtype=None, value_dtype=None, query_rope_dtype=None,
        key_rope_dtype=None, key_shared_prefix_dtype=None, value_shared_prefix_dtype=None,
        dequant_scale_query_dtype=None, dequant_scale_key_dtype=None, dequant_scale_value_dtype=None,
        dequant_scale_key_rope_dtype=None, out_dtype=None, workspace=None, out,
    ):
        args = dict(locals())
        op = "npu_fused_infer_attention_score_v2.out"
        _reject_unmodelled(op, args, V2_UNMODELLED_TENSORS, V2_UNMODELLED_MODES)
        return _write_out(op, out, run_fia(op, _v2_call(args), limits), return_softmax_lse)

    return {
        "npu_fused_infer_attention_score": npu_fused_infer_attention_score,
        "npu_fused_infer_attention_score.out": npu_fused_infer_attention_score_out,
        "npu_fused_infer_attention_score_v2": npu_fused_infer_attention_score_v2,
        "npu_fused_infer_attention_score_v2.out": npu_fused_infer_attention_score_v2_out,
    }
