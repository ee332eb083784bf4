"""Gated delta-net (GDN) linear attention in pure torch: the causal depthwise conv over each sequence's mixed q/k/v
(prefill and one-token update, with a per-sequence rolling conv state), the gating, the chunked gated delta rule for
prefills and its one-token recurrence for decodes.

States live in the caller's pool tensors and are read and written in place through slot indices, as vLLM's Mamba
state cache hands them over: conv states `[slots, dim, width - 1]` (any strides), recurrent states `[slots,
num_v_heads, head_v_dim, head_k_dim]` (vLLM's GDN layout: `S[v, k]`). The recurrence is computed in float32 whatever
the activations' dtype; outputs come back in the value's dtype.

The rule, per value head (its key head is `h // (num_v_heads // num_k_heads)`), token t:
    S <- exp(g_t) * S;   S <- S + beta_t * (v_t - S k_t) k_t^T;   o_t = scale * S q_t
with q and k L2-normalised first when asked. The chunked form gives the same outputs and final state with
matrix products per chunk (the WY form: one triangular solve per chunk instead of a loop over its tokens).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK_SIZE = 64
L2NORM_EPS = 1e-6


def _silu_if(out: torch.Tensor, activation: str | None) -> torch.Tensor:
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation: str | None = "silu", pad_slot_id: int = -1):
    starts = query_start_loc.tolist()
    slots = cache_indices.tolist()
    initial = has_initial_state.tolist()
    width = weight.shape[1]
    out = torch.empty_like(x)
    w = weight.unsqueeze(1)
    for i, (bos, eos) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        slot = slots[i]
        if bos == eos or slot == pad_slot_id:
            continue
        seq = x[bos:eos].t().to(conv_states.dtype)  # [dim, len]
        if initial[i]:
            prior = conv_states[slot, :, :width - 1]
        else:
            prior = torch.zeros(seq.shape[0], width - 1, dtype=seq.dtype, device=seq.device)
        window = torch.cat([prior, seq], dim=-1)
        conv = F.conv1d(window.unsqueeze(0).to(weight.dtype), w, bias, groups=weight.shape[0])[0]
        out[bos:eos] = _silu_if(conv, activation).t().to(out.dtype)
        conv_states[slot, :, :width - 1] = window[:, -(width - 1):]
    return out


def causal_conv1d_update(x, weight, bias, conv_states, cache_indices, activation: str | None = "silu",
                         pad_slot_id: int = -1):
    width = weight.shape[1]
    idx = cache_indices.long()
    live = idx != pad_slot_id
    out = torch.zeros_like(x)
    if not bool(live.any()):
        return out
    rows = idx[live]
    prior = conv_states[rows, :, :width - 1]  # [n, dim, width-1]
    window = torch.cat([prior, x[live].unsqueeze(-1).to(prior.dtype)], dim=-1)
    conv = (window.to(weight.dtype) * weight).sum(-1)
    if bias is not None:
        conv = conv + bias
    out[live] = _silu_if(conv, activation).to(out.dtype)
    conv_states[rows, :, :width - 1] = window[:, :, 1:]
    return out


def gdn_gating(A_log, a, b, dt_bias):  # noqa: N803 (the model's parameter name)
    g = -torch.exp(A_log.float()) * F.softplus(a.float() + dt_bias.float(), beta=1.0, threshold=20.0)
    return g, torch.sigmoid(b.float())


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x scaled to unit L2 norm over its last dim (float32 in, float32 out; the NPU bindings normalise with it too,
    since torch_npu's gated delta rule kernels take q and k already normalised)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _prepare(q, k, v, qk_l2norm: bool):
    """float32 q, k (L2-normalised when asked, repeated to the value heads) and v, each `[tokens, hv, dim]`."""
    q, k, v = q.float(), k.float(), v.float()
    if qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    group = v.shape[1] // k.shape[1]
    if group > 1:
        q, k = q.repeat_interleave(group, dim=1), k.repeat_interleave(group, dim=1)
    return q, k, v


def _chunked_sequence(q, k, v, g, beta, state, scale: float, chunk_size: int):
    """One sequence: q, k, v `[T, H, d]` float32, g and beta `[T, H]`, state `[H, dv, dk]` float32 (the initial
    state). Returns the outputs `[T, H, dv]` and the final state."""
    s = state.transpose(-1, -2)  # [H, dk, dv]
    outs = []
    for start in range(0, q.shape[0], chunk_size):
        qc, kc, vc = (t[start:start + chunk_size].transpose(0, 1) for t in (q, k, v))  # [H, C, d]
        gc = g[start:start + chunk_size].t().cumsum(-1)  # [H, C] cumulative log decay
        bc = beta[start:start + chunk_size].t()
        n = qc.shape[1]
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        decay = (gc[:, :, None] - gc[:, None, :]).masked_fill(~causal, float("-inf")).exp()  # [H, C, C]
        kb = kc * bc[..., None]
        # WY form: T = (I + strict_lower(beta k k^T * decay))^-1, one triangular solve per chunk.
        lower = (kb @ kc.transpose(-1, -2) * decay).tril(-1)
        eye = torch.eye(n, dtype=q.dtype, device=q.device).expand_as(lower)
        t = torch.linalg.solve_triangular(eye + lower, eye, upper=False)
        u = t @ (vc * bc[..., None])
        w = t @ (kb * gc.exp()[..., None])
        v_new = u - w @ s
        attn = (qc @ kc.transpose(-1, -2) * decay)
        out = (qc * gc.exp()[..., None]) @ s + attn @ v_new
        outs.append(out.transpose(0, 1) * scale)
        last = gc[:, -1]
        s = s * last.exp()[:, None, None] + (kc * (last[:, None] - gc).exp()[..., None]).transpose(-1, -2) @ v_new
    return torch.cat(outs, dim=0), s.transpose(-1, -2)


def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_indices, has_initial_state,
                           scale: float, qk_l2norm: bool = True, chunk_size: int = CHUNK_SIZE):
    q, k, v32 = _prepare(q, k, v, qk_l2norm)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    starts = query_start_loc.tolist()
    slots = state_indices.tolist()
    initial = has_initial_state.tolist()
    for i, (bos, eos) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        if bos == eos:
            continue
        slot = slots[i]
        if initial[i]:
            s0 = ssm_states[slot].float()
        else:
            s0 = torch.zeros(ssm_states.shape[1:], dtype=torch.float32, device=v.device)
        o, s = _chunked_sequence(q[bos:eos], k[bos:eos], v32[bos:eos], g[bos:eos], beta[bos:eos], s0, scale,
                                 chunk_size)
        out[bos:eos] = o.to(out.dtype)
        ssm_states[slot] = s.to(ssm_states.dtype)
    return out


def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, state_indices, scale: float, qk_l2norm: bool = True,
                               pad_slot_id: int = -1):
    q, k, v32 = _prepare(q, k, v, qk_l2norm)
    out = torch.zeros(v.shape, dtype=v.dtype, device=v.device)
    idx = state_indices.long()
    live = idx != pad_slot_id
    if not bool(live.any()):
        return out
    rows = idx[live]
    s = ssm_states[rows].float()  # [n, H, dv, dk]
    s = s * g[live].exp()[..., None, None]
    kn, qn = k[live], q[live]  # [n, H, dk]
    pred = (s @ kn.unsqueeze(-1)).squeeze(-1)  # [n, H, dv]
    delta = (v32[live] - pred) * beta[live][..., None]
    s = s + delta.unsqueeze(-1) * kn.unsqueeze(-2)
    out[live] = ((s @ qn.unsqueeze(-1)).squeeze(-1) * scale).to(out.dtype)
    ssm_states[rows] = s.to(ssm_states.dtype)
    return out
