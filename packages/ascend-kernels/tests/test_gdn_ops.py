"""The gated delta-net ops of the facade: the chunked rule against its own one-token recurrence (across chunk edges,
from a stored state, with value heads sharing key heads), the conv's prefill against prefill-then-update, and both
against vLLM's CPU GDN ops (what plain vLLM CPU runs), whose recurrent state is stored transposed (`S[k, v]` in the
`[slots, hv, dv, dk]` tensor) where ours keeps vLLM's declared `S[v, k]`."""

from __future__ import annotations

import pytest
import torch

from ascend_kernels import ops

D = 32  # small head dims for the self-consistency tests; the vLLM parity uses its 128


def _inputs(tokens: int, hk: int, hv: int, d: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, hk, d, generator=g).to(dtype)
    k = torch.randn(tokens, hk, d, generator=g).to(dtype)
    v = torch.randn(tokens, hv, d, generator=g).to(dtype)
    a = torch.randn(tokens, hv, generator=g).to(dtype)
    b = torch.randn(tokens, hv, generator=g).to(dtype)
    return q, k, v, a, b


def test_chunked_rule_equals_its_recurrence_across_chunk_edges_and_from_a_stored_state():
    q, k, v, a, b = _inputs(45, 1, 2, D)
    g, beta = ops.gdn_gating(torch.randn(2), a, b, torch.randn(2))
    states = torch.randn(4, 2, D, D) * 0.1
    chunked = states.clone()
    starts = torch.tensor([0, 20, 45])
    out = ops.chunk_gated_delta_rule(q, k, v, g, beta, chunked, starts, torch.tensor([1, 3]),
                                     torch.tensor([True, False]), D ** -0.5, chunk_size=8)
    stepped = states.clone()
    stepped[3] = 0
    rows = []
    for t in range(45):
        slot = torch.tensor([1 if t < 20 else 3])
        rows.append(ops.recurrent_gated_delta_rule(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1],
                                                   stepped, slot, D ** -0.5))
    torch.testing.assert_close(out, torch.cat(rows), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunked[[1, 3]], stepped[[1, 3]], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(chunked[[0, 2]], states[[0, 2]], rtol=0, atol=0)  # other slots untouched
    again = states.clone()
    out64 = ops.chunk_gated_delta_rule(q, k, v, g, beta, again, starts, torch.tensor([1, 3]),
                                       torch.tensor([True, False]), D ** -0.5, chunk_size=64)
    torch.testing.assert_close(out64, out, rtol=1e-4, atol=1e-5)


def test_conv_prefill_then_updates_equals_one_prefill():
    dim, width = 12, 4
    x = torch.randn(10, dim)
    weight, bias = torch.randn(dim, width), torch.randn(dim)
    whole = torch.zeros(3, dim, width - 1)
    one = ops.causal_conv1d_prefill(x, weight, bias, whole, torch.tensor([0, 10]), torch.tensor([2]),
                                    torch.tensor([False]))
    split = torch.zeros(3, dim, width - 1)
    head = ops.causal_conv1d_prefill(x[:6], weight, bias, split, torch.tensor([0, 6]), torch.tensor([2]),
                                     torch.tensor([False]))
    tail = [ops.causal_conv1d_update(x[t:t + 1], weight, bias, split, torch.tensor([2])) for t in range(6, 10)]
    torch.testing.assert_close(torch.cat([head, *tail]), one, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split, whole, rtol=0, atol=0)
    resumed = torch.zeros(3, dim, width - 1)
    ops.causal_conv1d_prefill(x[:6], weight, bias, resumed, torch.tensor([0, 6]), torch.tensor([0]),
                              torch.tensor([False]))
    rest = ops.causal_conv1d_prefill(x[6:], weight, bias, resumed, torch.tensor([0, 4]), torch.tensor([0]),
                                     torch.tensor([True]))
    torch.testing.assert_close(rest, one[6:], rtol=1e-5, atol=1e-5)


def test_validation_names_a_state_pool_of_the_wrong_orientation():
    q, k, v, a, b = _inputs(4, 1, 2, 16)
    g, beta = ops.gdn_gating(torch.zeros(2), a, b, torch.zeros(2))
    with pytest.raises(ValueError, match="ssm_states"):
        ops.recurrent_gated_delta_rule(q, k, v, g, beta, torch.zeros(2, 16, 2, 16), torch.arange(4) % 2, 0.25)


def test_prefill_and_decode_equal_vllms_cpu_gdn_ops():
    # vLLM is in every environment this suite runs in: a missing module is a failure, not a skip.
    import vllm._custom_ops as upstream

    tokens, hk, hv, d = 40, 1, 2, 128
    q, k, v, a, b = _inputs(tokens, hk, hv, d, torch.bfloat16, seed=1)
    a_log, dt_bias = torch.randn(hv), torch.randn(hv).to(torch.bfloat16)
    states = torch.randn(4, hv, d, d) * 0.1
    starts, slots, initial = (torch.tensor([0, 15, 40], dtype=torch.int32), torch.tensor([1, 3], dtype=torch.int32),
                              torch.tensor([True, False]))
    g, beta = ops.gdn_gating(a_log, a, b, dt_bias)
    theirs_g, theirs_beta = upstream.fused_gdn_gating_cpu(A_log=a_log, a=a, b=b, dt_bias=dt_bias)
    torch.testing.assert_close(g, theirs_g.float().view_as(g), rtol=1e-5, atol=1e-5)
    ours_states = states.clone()
    # vLLM's CPU prefill rounds beta to bf16; give both the same beta to compare the rule itself.
    out = ops.chunk_gated_delta_rule(q, k, v, g, theirs_beta.float().view_as(beta), ours_states, starts, slots,
                                     initial, d ** -0.5)
    theirs_states = states.transpose(-1, -2).contiguous()
    theirs_states[3] = 0  # vLLM's CPU layer zeroes the slot of a sequence without a stored state before the call
    theirs, _ = upstream.chunk_gated_delta_rule_cpu(
        query=q.unsqueeze(0), key=k.unsqueeze(0), value=v.unsqueeze(0), g=theirs_g, beta=theirs_beta,
        initial_state=theirs_states, output_final_state=True, cu_seqlens=starts, head_first=False,
        use_qk_l2norm_in_kernel=True, initial_state_indices=slots)
    torch.testing.assert_close(out.float(), theirs[0].float(), rtol=0.02, atol=5e-4)
    torch.testing.assert_close(ours_states[[1, 3]], theirs_states.transpose(-1, -2)[[1, 3]], rtol=0.02, atol=5e-3)
    # Decode: one token for each of two sequences.
    ours_states, theirs_states = states.clone(), states.transpose(-1, -2).contiguous()
    g2, beta2 = ops.gdn_gating(a_log, a[:2], b[:2], dt_bias)
    decoded = ops.recurrent_gated_delta_rule(q[:2], k[:2], v[:2], g2, beta2, ours_states, slots.long(), d ** -0.5)
    theirs = upstream.fused_sigmoid_gating_delta_rule_update_cpu(
        A_log=a_log, dt_bias=dt_bias, q=q[:2].unsqueeze(0), k=k[:2].unsqueeze(0), v=v[:2].unsqueeze(0), a=a[:2],
        b=b[:2], initial_state_source=theirs_states, initial_state_indices=slots,
        cu_seqlens=torch.tensor([0, 1, 2], dtype=torch.int32), use_qk_l2norm_in_kernel=True)
    torch.testing.assert_close(decoded.float(), theirs.view_as(decoded).float(), rtol=0.02, atol=5e-4)
    torch.testing.assert_close(ours_states, theirs_states.transpose(-1, -2), rtol=0.02, atol=5e-3)
