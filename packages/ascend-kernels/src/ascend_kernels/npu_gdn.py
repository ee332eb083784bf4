"""NPU bindings of the gated delta rule ops (`ascend_kernels.ops_gdn`), over torch_npu 2.13.0's

    npu_recurrent_gated_delta_rule(Tensor query, Tensor key, Tensor value, Tensor(a!) state, *, Tensor? beta=None,
        float? scale=None, Tensor? actual_seq_lengths=None, Tensor? ssm_state_indices=None,
        Tensor? num_accepted_tokens=None, Tensor? g=None, Tensor? gk=None) -> Tensor
    npu_chunk_gated_delta_rule(Tensor query, Tensor key, Tensor value, *, Tensor? beta=None,
        Tensor? initial_state=None, Tensor? actual_seq_lengths=None, float? scale=None, Tensor? g=None)
        -> (Tensor, Tensor)

as torch_npu's docs state them: tokens packed `[T, heads, dim]` with per-sequence lengths (int32), the state
`[.., Nv, Dv, Dk]` (vLLM's GDN layout, no transpose), `g` the float32 log decay, q and k passed already
L2-normalised (the kernels do not normalise), bfloat16 for q, k, v, beta, the state and the output. vLLM keeps
GDN recurrent states in float32 by default: such a pool is handed to the kernels as bfloat16 and their states written
back widened, so on an NPU the state is rounded to bfloat16 at each call (as vllm-ascend feeds its prefill kernel);
`--mamba-ssm-cache-dtype bfloat16` makes the pool itself bfloat16. The recurrent
kernel updates `state[ssm_state_indices[t]]` in place; the chunk kernel returns each sequence's final state, written
back here. Outside what the kernels take (another dtype; the chunk kernel's Dk = Dv = 128 and at most 64 heads) the
reference runs on the device, counted in `npu_usage` with the reason.

vLLM's state pool is a strided view into the hybrid cache's shared pages; the recurrent kernel writes its state in
place through indices, so a pool that is not dense bfloat16 is gathered into a dense block for the call and
scattered back.
Padded decode rows (slot `pad_slot_id`) are left out of the call and come back zero.
"""

from __future__ import annotations

import itertools

import torch

from ascend_kernels import npu_usage
from ascend_kernels.npu_backend import _npu
from ascend_kernels.reference import gdn as _ref

_CHUNK_DIM = 128
_CHUNK_MAX_HEADS = 64
_RECURRENT_MAX_DIM = 512
_RECURRENT_MAX_HEADS = 256
_STATE_DTYPES = (torch.bfloat16, torch.float32)


def _refusal(k, v, ssm_states, max_heads: int, dims_ok: bool, dims: str) -> str | None:
    if v.dtype != torch.bfloat16 or ssm_states.dtype not in _STATE_DTYPES:
        return (f"activations {v.dtype}, state {ssm_states.dtype}: the kernel takes bfloat16 q/k/v and a bfloat16 "
                "state (a float32 pool is passed as bfloat16)")
    if max(k.shape[1], v.shape[1]) > max_heads:
        return f"{k.shape[1]} key / {v.shape[1]} value heads: the kernel takes at most {max_heads}"
    if not dims_ok:
        return f"head dims k {k.shape[2]}, v {v.shape[2]}: the kernel takes {dims}"
    return None


def _normalised(x: torch.Tensor, on: bool) -> torch.Tensor:
    return (_ref.l2norm(x.float()) if on else x).to(torch.bfloat16).contiguous()


def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, state_indices, scale: float, qk_l2norm: bool = True,
                               pad_slot_id: int = -1):
    dims_ok = max(k.shape[2], v.shape[2]) <= _RECURRENT_MAX_DIM
    reason = _refusal(k, v, ssm_states, _RECURRENT_MAX_HEADS, dims_ok, f"at most {_RECURRENT_MAX_DIM}")
    if reason is not None:
        npu_usage.record_fallback("recurrent_gated_delta_rule", reason)
        return _ref.recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, state_indices, scale, qk_l2norm,
                                               pad_slot_id)
    out = v.new_zeros(v.shape)
    rows = (state_indices != pad_slot_id).nonzero().squeeze(1)
    n = rows.numel()
    if n == 0:
        return out
    slots = state_indices[rows].long()
    dense = ssm_states.is_contiguous() and ssm_states.dtype == torch.bfloat16
    state = ssm_states if dense else ssm_states[slots].to(torch.bfloat16).contiguous()
    indices = slots if dense else torch.arange(n, device=v.device)
    result = _npu().npu_recurrent_gated_delta_rule(
        _normalised(q[rows], qk_l2norm), _normalised(k[rows], qk_l2norm), v[rows].contiguous(), state,
        beta=beta[rows].to(torch.bfloat16).contiguous(), scale=float(scale),
        actual_seq_lengths=torch.ones(n, dtype=torch.int32, device=v.device),
        ssm_state_indices=indices.to(torch.int32), g=g[rows].float().contiguous())
    if not dense:
        ssm_states[slots] = state.to(ssm_states.dtype)
    out[rows] = result.to(out.dtype)
    return out


def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_indices, has_initial_state,
                           scale: float, qk_l2norm: bool = True, chunk_size: int = _ref.CHUNK_SIZE):
    dims_ok = k.shape[2] == _CHUNK_DIM and v.shape[2] == _CHUNK_DIM
    reason = _refusal(k, v, ssm_states, _CHUNK_MAX_HEADS, dims_ok, f"Dk = Dv = {_CHUNK_DIM} only")
    if reason is not None:
        npu_usage.record_fallback("chunk_gated_delta_rule", reason)
        return _ref.chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_indices,
                                           has_initial_state, scale, qk_l2norm, chunk_size)
    out = v.new_zeros(v.shape)
    starts = query_start_loc.tolist()
    # The kernel's lengths are each sequence's own, at least one token: empty sequences are left out.
    seqs = [(i, eos - bos) for i, (bos, eos) in enumerate(itertools.pairwise(starts)) if eos > bos]
    if not seqs:
        return out
    first, last = starts[0], starts[-1]
    picked = torch.tensor([i for i, _ in seqs], device=v.device)
    slots = state_indices[picked].long()
    # A fresh sequence starts from zeros, not from whatever its slot holds (a new block's bytes may be anything).
    fresh = ~has_initial_state[picked].bool()[:, None, None, None]
    initial = ssm_states[slots].masked_fill(fresh, 0).to(torch.bfloat16)
    result, final = _npu().npu_chunk_gated_delta_rule(
        _normalised(q[first:last], qk_l2norm), _normalised(k[first:last], qk_l2norm), v[first:last].contiguous(),
        beta=beta[first:last].to(torch.bfloat16).contiguous(), initial_state=initial.contiguous(),
        actual_seq_lengths=torch.tensor([n for _, n in seqs], dtype=torch.int32, device=v.device),
        scale=float(scale), g=g[first:last].float().contiguous())
    ssm_states[slots] = final.to(ssm_states.dtype)
    out[first:last] = result.to(out.dtype)
    return out
