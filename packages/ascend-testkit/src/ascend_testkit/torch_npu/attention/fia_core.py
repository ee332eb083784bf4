"""The computation behind npu_fused_infer_attention_score and its _v2: one call, normalized, run request by request.

The two entry points (fused_infer_attention.py) differ only in argument names, v2's learnable_sink and KV antiquant
(antiquant.py: int8 keys and values dequantized in float64 before the attention) and which arguments they carry
that this fake does not model; both arrive here as an FiaCall.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ascend_testkit.torch_npu.attention.antiquant import AntiquantArgs, Dequant, resolve_antiquant
from ascend_testkit.torch_npu.attention.fia_limits import FiaShape, check_dtypes, check_shape
from ascend_testkit.torch_npu.attention.kv_sources import KvRequests, paged_kv, unpaged_kv
from ascend_testkit.torch_npu.attention.layouts import Layout, from_canonical, parse_layout, to_canonical
from ascend_testkit.torch_npu.attention.limits import CardLimits
from ascend_testkit.torch_npu.attention.refusals import (
    cumulative_lengths,
    dtype_names,
    int_list,
    per_batch_lengths,
    refuse,
    require_contiguous,
)
from ascend_testkit.torch_npu.attention.softmax_attention import attend
from ascend_testkit.torch_npu.attention.sparse_modes import Visibility, resolve_visibility

MAX_SINK_VALUE_DIM = 128


@dataclass(frozen=True, kw_only=True)
class FiaCall:
    api: str  # "v1" / "v2": which names the refusals use
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    query_rope: torch.Tensor | None
    key_rope: torch.Tensor | None
    atten_mask: torch.Tensor | None
    block_table: torch.Tensor | None
    block_size: int
    q_lengths: list[int] | None
    kv_lengths: list[int] | None
    num_heads: int
    num_kv_heads: int
    scale: float
    pre_tokens: int
    next_tokens: int
    input_layout: str
    sparse_mode: int
    inner_precise: int
    return_lse: bool
    learnable_sink: torch.Tensor | None = None
    antiquant: AntiquantArgs | None = None  # v2 only

    @property
    def names(self) -> dict[str, str]:
        if self.api == "v1":
            return {"q_len": "actual_seq_lengths", "kv_len": "actual_seq_lengths_kv", "heads": "num_heads"}
        return {"q_len": "actual_seq_qlen", "kv_len": "actual_seq_kvlen", "heads": "num_query_heads"}


def _head_counts(op: str, call: FiaCall, limits: CardLimits) -> tuple[int, int]:
    heads_name = call.names["heads"]
    if call.num_heads <= 0:
        refuse(op, f"{heads_name} must be > 0, got {call.num_heads}")
    num_kv = call.num_heads if call.num_kv_heads == 0 else call.num_kv_heads  # 0: as many as the query
    if num_kv <= 0 or call.num_heads % num_kv:
        refuse(op, f"{heads_name}={call.num_heads} must be a multiple of num_key_value_heads={num_kv}")
    if call.num_heads // num_kv > limits.max_gqa_ratio:
        refuse(op, f"{heads_name} / num_key_value_heads = {call.num_heads // num_kv} exceeds "
               f"{limits.max_gqa_ratio}")
    if call.num_heads > limits.max_heads:
        refuse(op, f"{heads_name}={call.num_heads} exceeds {limits.max_heads}")
    return call.num_heads, num_kv


def _query_lengths(op: str, call: FiaCall, token_major: bool, q: torch.Tensor) -> tuple[int, list[int], bool]:
    """(batch, per-request query lengths, incremental): TND lengths are cumulative and must end at T."""
    name = call.names["q_len"]
    lengths = int_list(op, name, call.q_lengths)
    if token_major:
        if lengths is None:
            refuse(op, f"{name} is required for input_layout {call.input_layout}")
        per_request = cumulative_lengths(op, name, lengths, total=q.shape[0], exact=True)
        return len(per_request), per_request, False
    batch, seq = q.shape[0], q.shape[2]
    if seq == 1:  # the IncreFlashAttention branch ignores the query lengths
        return batch, [1] * batch, True
    return batch, per_batch_lengths(op, name, lengths, batch=batch, default=seq, capacity=seq), False


def _check_ropes(op: str, call: FiaCall) -> None:
    if (call.query_rope is None) != (call.key_rope is None):
        refuse(op, "query_rope and key_rope must be given together, got "
               f"query_rope={'given' if call.query_rope is not None else None}, "
               f"key_rope={'given' if call.key_rope is not None else None}")
    if call.query_rope is None:
        return
    if call.query_rope.dtype != call.query.dtype:
        refuse(op, f"query_rope dtype {call.query_rope.dtype} must equal query dtype {call.query.dtype}")
    if call.key_rope.dtype != call.key.dtype:
        refuse(op, f"key_rope dtype {call.key_rope.dtype} must equal key dtype {call.key.dtype}")
    q, qr = call.query, call.query_rope
    if qr.dim() != q.dim() or qr.shape[:-1] != q.shape[:-1]:
        refuse(op, f"query_rope shape {tuple(qr.shape)} must match query {tuple(q.shape)} except the last dim")


def _check_sink(op: str, call: FiaCall, limits: CardLimits, token_major: bool, value_dim: int) -> None:
    sink = call.learnable_sink
    if sink is None:
        return
    if not token_major:
        refuse(op, f"learnable_sink needs input_layout TND or NTD_TND, got {call.input_layout}")
    if tuple(sink.shape) != (call.num_heads,):
        refuse(op, f"learnable_sink must have shape ({call.num_heads},) (one per query head), got "
               f"{tuple(sink.shape)}")
    if sink.dtype not in limits.sink_dtypes:
        refuse(op, f"learnable_sink dtype must be one of {dtype_names(limits.sink_dtypes)}, got {sink.dtype}")
    if value_dim > MAX_SINK_VALUE_DIM:
        refuse(op, f"learnable_sink needs value D <= {MAX_SINK_VALUE_DIM}, got {value_dim}")


def _kv(op: str, call: FiaCall, layout: Layout, num_kv: int, batch: int) -> KvRequests:
    lengths = int_list(op, call.names["kv_len"], call.kv_lengths)
    if call.block_table is not None:
        return paged_kv(op, layout, call.key, call.value, call.key_rope, call.block_table, call.block_size, num_kv,
                        batch, lengths, call.names["kv_len"])
    return unpaged_kv(op, layout, call.key, call.value, call.key_rope, num_kv, batch, lengths,
                      call.names["kv_len"])


def _dequantized(kv: KvRequests, dequant: Dequant) -> KvRequests:
    """The requests' int8 keys and values as the float64 values the kernel attends over."""
    return replace(kv, keys=[dequant.keys(k) for k in kv.keys], values=[dequant.values(v) for v in kv.values])


def run_fia(op: str, call: FiaCall, limits: CardLimits) -> tuple[torch.Tensor, torch.Tensor]:
    layout = parse_layout(op, call.input_layout)
    num_heads, num_kv = _head_counts(op, call, limits)
    for name in ("query", "query_rope", "learnable_sink"):
        require_contiguous(op, name, getattr(call, name))
    if call.block_table is None:
        for name in ("key", "value", "key_rope"):
            require_contiguous(op, name, getattr(call, name))
    _check_ropes(op, call)
    q = to_canonical(op, layout.query, "query", call.query, num_heads)
    q_rope = None if call.query_rope is None else to_canonical(op, layout.query, "query_rope", call.query_rope,
                                                               num_heads)
    batch, q_lens, incremental = _query_lengths(op, call, layout.token_major, q)
    dequant = None if call.antiquant is None else resolve_antiquant(
        op, call.antiquant, query=call.query, key=call.key, value=call.value, token_major=layout.token_major,
        incremental=incremental, paged=call.block_table is not None, block_size=call.block_size,
        num_kv_heads=num_kv, int8_granularity=limits.int8_block_size_granularity)
    kv = _kv(op, call, layout, num_kv, batch)
    if dequant is not None:
        kv = _dequantized(kv, dequant)
    if kv.key_dim != q.shape[-1]:
        refuse(op, f"query D={q.shape[-1]} and key D={kv.key_dim} must be equal")
    if q_rope is not None and kv.key_ropes and kv.key_ropes[0].shape[-1] != q_rope.shape[-1]:
        refuse(op, f"query_rope D={q_rope.shape[-1]} and key_rope D={kv.key_ropes[0].shape[-1]} must be equal")
    check_dtypes(op, limits, query=call.query, key=call.key, value=call.value, token_major=layout.token_major,
                 paged=kv.paged, antiquant=dequant is not None)
    if call.inner_precise not in ((0, 1) if incremental else (0, 1, 2, 3)):
        refuse(op, f"inner_precise must be {'0 or 1 when Q_S is 1' if incremental else '0..3'}, got "
               f"{call.inner_precise}")
    _check_sink(op, call, limits, layout.token_major, kv.value_dim)
    check_shape(op, limits, FiaShape(
        api=call.api, token_major=layout.token_major, paged=kv.paged, block_size=call.block_size,
        paged_hidden=kv.paged_hidden, prompt=max(q_lens, default=0) > 1, num_heads=num_heads, num_kv_heads=num_kv,
        head_dim=q.shape[-1], value_dim=kv.value_dim,
        rope_dim=None if q_rope is None else q_rope.shape[-1], q_lens=q_lens, sparse_mode=call.sparse_mode,
        has_mask=call.atten_mask is not None))
    visibility = resolve_visibility(
        op, sparse_mode=call.sparse_mode, atten_mask=call.atten_mask, pre_tokens=call.pre_tokens,
        next_tokens=call.next_tokens, token_major=layout.token_major, incremental=incremental,
        has_rope=q_rope is not None, batch=batch, q_rows=max(q_lens, default=0) if layout.token_major else q.shape[2],
        kv_cols=kv.capacity, q_lens=q_lens, kv_lens=kv.lengths,
        short_mask_forms=q_rope is None and q.shape[-1] == kv.value_dim)
    return _assemble(call, layout, q, q_rope, kv, q_lens, visibility)


def _assemble(call: FiaCall, layout: Layout, q: torch.Tensor, q_rope: torch.Tensor | None, kv: KvRequests,
              q_lens: list[int], visibility: Visibility) -> tuple[torch.Tensor, torch.Tensor]:
    heads, dv = q.shape[1], kv.value_dim
    if layout.token_major:
        out = torch.zeros(q.shape[0], heads, dv, dtype=torch.float64)
        lse = torch.full((q.shape[0], heads), float("-inf"), dtype=torch.float64)
    else:
        out = torch.zeros(q.shape[0], heads, q.shape[2], dv, dtype=torch.float64)
        lse = torch.full((q.shape[0], heads, q.shape[2]), float("-inf"), dtype=torch.float64)
    start = 0
    for b, q_len in enumerate(q_lens):
        if layout.token_major:
            rows = q[start:start + q_len].permute(1, 0, 2)
            rope_rows = None if q_rope is None else q_rope[start:start + q_len].permute(1, 0, 2)
        else:
            rows = q[b, :, :q_len]
            rope_rows = None if q_rope is None else q_rope[b, :, :q_len]
        o, s = attend(rows, kv.keys[b], kv.values[b], visible=visibility.visible(b, q_len, kv.lengths[b]),
                      scale=call.scale, q_rope=rope_rows, k_rope=None if kv.key_ropes is None else kv.key_ropes[b],
                      sink=call.learnable_sink)
        if layout.token_major:
            out[start:start + q_len] = o.permute(1, 0, 2)
            lse[start:start + q_len] = s.permute(1, 0)
        else:
            out[b, :, :q_len] = o
            lse[b, :, :q_len] = s
        start += q_len
    attention_out = from_canonical(layout.out, out).to(call.query.dtype)
    if not call.return_lse:
        return attention_out, torch.empty(0, dtype=torch.float32)
    return attention_out, lse.unsqueeze(-1).to(torch.float32).contiguous()
