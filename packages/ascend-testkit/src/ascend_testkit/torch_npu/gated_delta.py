"""npu_recurrent_gated_delta_rule and npu_chunk_gated_delta_rule as torch_npu 2.13.0's API docs state them.

Per value head h (its key head `h // (Nv // Nk)`), token t of a sequence, with the state S `[Dv, Dk]`:
    S <- exp(g_t) S;   S <- S + beta_t (v_t - S k_t) k_t^T;   o_t = scale * S q_t
(`g` absent: no decay). q and k arrive L2-normalised: the docs make that the caller's job. Computed token by token
in float32 (the chunked kernel's blocking changes only its rounding), results in bfloat16, the only dtype either
kernel takes for q, k, v, beta and the state.

- recurrent (decode, MTP verification): tokens packed `[T, N, D]`, sequences of 1..8 tokens
  (`actual_seq_lengths` `[B]` int32); `state[ssm_state_indices[t]]` is token t's state: a sequence starts from its
  first token's slot and leaves each token's state in that token's slot (one token: updated in place). Speculative
  `num_accepted_tokens` and the `gk` decay are not modelled.
- chunk (prefill): tokens packed `[T, N, D]` by per-sequence lengths; `initial_state` `[B, Nv, Dv, Dk]` one per
  sequence, returned as `(out, final_state)`; Dk = Dv = 128, Nk and Nv at most 64.
"""

from __future__ import annotations

import torch

from ascend_testkit.torch_npu.attention.refusals import refuse, require_dim, require_dtype, unmodelled

_BF16 = (torch.bfloat16,)
_RECURRENT_MAX_LEN = 8
_RECURRENT_MAX_DIM = 512
_RECURRENT_MAX_HEADS = 256
_CHUNK_DIM = 128
_CHUNK_MAX_HEADS = 64


def _heads(op: str, query, key, value, max_heads: int) -> tuple[int, int, int, int]:
    for name, t in (("query", query), ("key", key), ("value", value)):
        require_dtype(op, name, t, _BF16)
        require_dim(op, name, t, (3,))
    if query.shape != key.shape or query.shape[0] != value.shape[0]:
        refuse(op, f"query {tuple(query.shape)} and key {tuple(key.shape)} must be [T, Nk, Dk] and value "
                   f"{tuple(value.shape)} [T, Nv, Dv] over the same T")
    nk, nv = key.shape[1], value.shape[1]
    if nk > max_heads or nv > max_heads or nv % nk:
        refuse(op, f"Nk={nk}, Nv={nv}: each at most {max_heads}, Nv a multiple of Nk")
    return nk, nv, key.shape[2], value.shape[2]


def _per_token(op: str, name: str, t, dtypes, tokens: int, nv: int) -> None:
    if t is None:
        return
    require_dtype(op, name, t, dtypes)
    if tuple(t.shape) != (tokens, nv):
        refuse(op, f"{name} must be [T={tokens}, Nv={nv}], got {tuple(t.shape)}")


def _lengths(op: str, actual_seq_lengths, tokens: int, max_len: int | None) -> list[int]:
    if actual_seq_lengths is None:
        refuse(op, "actual_seq_lengths is required")
    require_dtype(op, "actual_seq_lengths", actual_seq_lengths, (torch.int32,))
    require_dim(op, "actual_seq_lengths", actual_seq_lengths, (1,))
    lengths = [int(n) for n in actual_seq_lengths.tolist()]
    if sum(lengths) != tokens or any(n < 1 or (max_len is not None and n > max_len) for n in lengths):
        bound = f"each in [1, {max_len}]" if max_len is not None else "each at least 1"
        refuse(op, f"actual_seq_lengths {lengths} must sum to T={tokens}, {bound}")
    return lengths


def _step(s: torch.Tensor, q, k, v, g, beta, scale: float, group: int) -> torch.Tensor:
    """One token of every value head: s `[Nv, Dv, Dk]` float32 (updated in place); returns o `[Nv, Dv]`."""
    q, k = q.float().repeat_interleave(group, 0), k.float().repeat_interleave(group, 0)  # [Nv, Dk]
    if g is not None:
        s.mul_(g.float().exp()[:, None, None])
    delta = (v.float() - (s @ k[..., None]).squeeze(-1)) * beta.float()[:, None]  # [Nv, Dv]
    s.add_(delta[..., None] * k[:, None, :])
    return scale * (s @ q[..., None]).squeeze(-1)


def npu_recurrent_gated_delta_rule(*, query, key, value, state, beta, scale, actual_seq_lengths, ssm_state_indices,
                                   num_accepted_tokens, g, gk):
    op = "npu_recurrent_gated_delta_rule"
    nk, nv, dk, dv = _heads(op, query, key, value, _RECURRENT_MAX_HEADS)
    if max(dk, dv) > _RECURRENT_MAX_DIM:
        refuse(op, f"Dk={dk}, Dv={dv}: each at most {_RECURRENT_MAX_DIM}")
    tokens = value.shape[0]
    require_dtype(op, "state", state, _BF16)
    if state.dim() != 4 or tuple(state.shape[1:]) != (nv, dv, dk) or state.shape[0] < tokens:
        refuse(op, f"state must be [BlockNum >= T={tokens}, Nv={nv}, Dv={dv}, Dk={dk}], got {tuple(state.shape)}")
    if beta is None or scale is None or ssm_state_indices is None:
        refuse(op, "beta, scale and ssm_state_indices are required")
    _per_token(op, "beta", beta, _BF16, tokens, nv)
    _per_token(op, "g", g, (torch.float32,), tokens, nv)
    if gk is not None:
        unmodelled(op, "gk", "a tensor")
    if num_accepted_tokens is not None:
        unmodelled(op, "num_accepted_tokens", "a tensor")
    lengths = _lengths(op, actual_seq_lengths, tokens, _RECURRENT_MAX_LEN)
    require_dtype(op, "ssm_state_indices", ssm_state_indices, (torch.int32,))
    slots = [int(i) for i in ssm_state_indices.tolist()]
    if len(slots) != tokens or any(not 0 <= i < state.shape[0] for i in slots):
        refuse(op, f"ssm_state_indices {slots} must be [T={tokens}] slots of state's {state.shape[0]}")
    out = torch.empty(tokens, nv, dv, dtype=torch.bfloat16, device=value.device)
    t = 0
    for n in lengths:
        s = state[slots[t]].float()
        for i in range(t, t + n):
            out[i] = _step(s, query[i], key[i], value[i], None if g is None else g[i], beta[i], scale, nv // nk)
            state[slots[i]] = s.to(state.dtype)
        t += n
    return out


def npu_chunk_gated_delta_rule(*, query, key, value, beta, initial_state, actual_seq_lengths, scale, g):
    op = "npu_chunk_gated_delta_rule"
    nk, nv, dk, dv = _heads(op, query, key, value, _CHUNK_MAX_HEADS)
    if dk != _CHUNK_DIM or dv != _CHUNK_DIM:
        refuse(op, f"Dk={dk}, Dv={dv}: both must be {_CHUNK_DIM}")
    tokens = value.shape[0]
    if beta is None or initial_state is None:
        refuse(op, "beta and initial_state are required")
    _per_token(op, "beta", beta, _BF16, tokens, nv)
    _per_token(op, "g", g, (torch.float32,), tokens, nv)
    lengths = _lengths(op, actual_seq_lengths, tokens, None)
    require_dtype(op, "initial_state", initial_state, _BF16)
    if tuple(initial_state.shape) != (len(lengths), nv, dv, dk):
        refuse(op, f"initial_state must be [B={len(lengths)}, Nv={nv}, Dv={dv}, Dk={dk}], "
                   f"got {tuple(initial_state.shape)}")
    scale = 1.0 if scale is None else scale
    out = torch.empty(tokens, nv, dv, dtype=torch.bfloat16, device=value.device)
    final = torch.empty_like(initial_state)
    t = 0
    for b, n in enumerate(lengths):
        s = initial_state[b].float()
        for i in range(t, t + n):
            out[i] = _step(s, query[i], key[i], value[i], None if g is None else g[i], beta[i], scale, nv // nk)
        final[b] = s.to(final.dtype)
        t += n
    return out, final
