"""Gated delta-net (GDN) linear-attention ops of the kernel facade, as Qwen3-Next / Qwen3.5's linear-attention layers
run them: the causal depthwise conv over the mixed q/k/v (prefill and one-token update, with its rolling conv
state), the gating, the chunked gated delta rule for prefills and its recurrence for decodes.

States are the Mamba-style state pool vLLM plans for the layer, read and written in place through slot indices: conv
states `[slots, dim, width - 1]` (strided views allowed), recurrent states `[slots, num_v_heads, head_v_dim,
head_k_dim]`. Sequences are packed along the token axis and cut by `query_start_loc` (`[num_seqs + 1]`).

On an NPU the gated delta rule runs torch_npu 2.13.0's `npu_chunk_gated_delta_rule` (prefill) and
`npu_recurrent_gated_delta_rule` (decode), as its API docs state them (`ascend_kernels.npu_gdn`). The conv and the
gating run the reference on the device: torch_npu's `npu_fused_causal_conv1d` is documented for the Atlas 350 only,
with its kernel width fixed at 3 (Qwen3-Next and Qwen3.5 convolve over 4) and no activation, and there is no gating
kernel; the facade counts these as `npu:<op>` running the reference (see docs/hybrid_models.md).
"""

from __future__ import annotations

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import NpuBinding, kernel_op, reference_on_device
from ascend_kernels.reference import gdn as _ref

_NPU = reference_on_device("gdn", "torch_npu's npu_fused_causal_conv1d is documented for the Atlas 350 only, width 3 "
                                  "(these models use 4), and there is no gating kernel: the reference runs on the NPU")
_NPU_CHUNK = NpuBinding(target="torch_npu.npu_chunk_gated_delta_rule", kind="torch_npu",
                        impl="ascend_kernels.npu_gdn:chunk_gated_delta_rule",
                        note="bfloat16, Dk = Dv = 128, at most 64 heads; q/k L2-normalised before the call")
_NPU_RECURRENT = NpuBinding(target="torch_npu.npu_recurrent_gated_delta_rule", kind="torch_npu",
                            impl="ascend_kernels.npu_gdn:recurrent_gated_delta_rule",
                            note="bfloat16; a strided state pool is gathered into a dense block and scattered back")


def _packed(op: str, x) -> None:
    _v.tensor(op, "x", x, 2, "[num_tokens, dim]")
    _v.floating(op, "x", x, "[num_tokens, dim]")


def _conv(op: str, x, weight, conv_states) -> None:
    _packed(op, x)
    _v.tensor(op, "weight", weight, 2, f"[dim={x.shape[1]}, width]")
    if weight.shape[0] != x.shape[1] or weight.shape[1] < 2:
        _v.fail(op, "weight", weight, f"[dim={x.shape[1]}, width >= 2]")
    _v.tensor(op, "conv_states", conv_states, 3, f"[slots, dim={x.shape[1]}, >= width - 1]")
    if conv_states.shape[1] != x.shape[1] or conv_states.shape[2] < weight.shape[1] - 1:
        _v.fail(op, "conv_states", conv_states, f"[slots, dim={x.shape[1]}, >= {weight.shape[1] - 1}]")
    _v.same_device(op, "conv_states", conv_states, x.device, "[slots, dim, width - 1]")


def _sequences(op: str, query_start_loc, num_tokens: int, per_seq: dict) -> None:
    _v.index(op, "query_start_loc", query_start_loc, 1, "[num_seqs + 1] token offsets")
    n = query_start_loc.shape[0] - 1
    for name, t in per_seq.items():
        if not hasattr(t, "shape") or t.dim() != 1 or t.shape[0] < n:
            _v.fail(op, name, t, f"[>= num_seqs={n}] per sequence")
    if n >= 0 and int(query_start_loc[-1]) > num_tokens:
        _v.fail(op, "query_start_loc", query_start_loc, f"offsets ending at most at num_tokens={num_tokens}")


def _heads(op: str, q, k, v, g, beta, ssm_states) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _v.tensor(op, name, t, 3, "[num_tokens, heads, head_dim]")
        _v.floating(op, name, t, "[num_tokens, heads, head_dim]")
    hv = v.shape[1]
    if q.shape != k.shape or q.shape[0] != v.shape[0] or hv % k.shape[1]:
        _v.fail(op, "k", k, f"q's shape {tuple(q.shape)}, key heads dividing the {hv} value heads")
    for name, t in (("g", g), ("beta", beta)):
        _v.tensor(op, name, t, 2, f"[num_tokens={v.shape[0]}, value heads={hv}]")
        if tuple(t.shape) != (v.shape[0], hv):
            _v.fail(op, name, t, f"[num_tokens={v.shape[0]}, value heads={hv}]")
    expected = f"[slots, {hv}, {v.shape[2]}, {k.shape[2]}] (value heads, head_v_dim, head_k_dim)"
    _v.tensor(op, "ssm_states", ssm_states, 4, expected)
    if tuple(ssm_states.shape[1:]) != (hv, v.shape[2], k.shape[2]):
        _v.fail(op, "ssm_states", ssm_states, expected)


def check_causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                                activation, pad_slot_id) -> None:
    op = "causal_conv1d_prefill"
    _conv(op, x, weight, conv_states)
    _sequences(op, query_start_loc, x.shape[0], {"cache_indices": cache_indices,
                                                 "has_initial_state": has_initial_state})


def check_causal_conv1d_update(x, weight, bias, conv_states, cache_indices, activation, pad_slot_id) -> None:
    op = "causal_conv1d_update"
    _conv(op, x, weight, conv_states)
    _v.index(op, "cache_indices", cache_indices, 1, f"[num_tokens={x.shape[0]}] slot per sequence")
    if cache_indices.shape[0] != x.shape[0]:
        _v.fail(op, "cache_indices", cache_indices, f"[num_tokens={x.shape[0]}] slot per sequence")


def check_gdn_gating(A_log, a, b, dt_bias) -> None:  # noqa: N803
    op = "gdn_gating"
    for name, t in (("a", a), ("b", b)):
        _v.tensor(op, name, t, 2, "[num_tokens, value heads]")
    if a.shape != b.shape or A_log.shape[-1] != a.shape[1] or dt_bias.shape[-1] != a.shape[1]:
        _v.fail(op, "a", a, f"b's shape {tuple(b.shape)} with A_log and dt_bias of one entry per value head")


def check_chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_indices, has_initial_state,
                                 scale, qk_l2norm, chunk_size) -> None:
    op = "chunk_gated_delta_rule"
    _heads(op, q, k, v, g, beta, ssm_states)
    _sequences(op, query_start_loc, v.shape[0], {"state_indices": state_indices,
                                                 "has_initial_state": has_initial_state})
    _v.number(op, "scale", scale, "a positive scale", positive=True)
    _v.number(op, "chunk_size", chunk_size, "a positive chunk length", positive=True)


def check_recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, state_indices, scale, qk_l2norm,
                                     pad_slot_id) -> None:
    op = "recurrent_gated_delta_rule"
    _heads(op, q, k, v, g, beta, ssm_states)
    _v.index(op, "state_indices", state_indices, 1, f"[num_tokens={v.shape[0]}] slot per sequence")
    if state_indices.shape[0] != v.shape[0]:
        _v.fail(op, "state_indices", state_indices, f"[num_tokens={v.shape[0]}] slot per sequence")
    _v.number(op, "scale", scale, "a positive scale", positive=True)


@kernel_op(validate=check_causal_conv1d_prefill, reference=_ref.causal_conv1d_prefill, npu=_NPU)
def causal_conv1d_prefill(x, weight, bias, conv_states, query_start_loc, cache_indices, has_initial_state,
                          activation: str | None = "silu", pad_slot_id: int = -1):
    """Causal depthwise conv of each sequence `x[qsl[i]:qsl[i+1]]` (`x` `[num_tokens, dim]`, `weight` `[dim,
    width]`), prefixed by its conv state `conv_states[cache_indices[i]]` when `has_initial_state[i]`, else by zeros;
    SiLU after when `activation` is "silu". Leaves the sequence's last `width - 1` inputs in its conv state. Returns
    `[num_tokens, dim]` in `x`'s dtype; sequences whose slot is `pad_slot_id` are skipped."""


@kernel_op(validate=check_causal_conv1d_update, reference=_ref.causal_conv1d_update, npu=_NPU)
def causal_conv1d_update(x, weight, bias, conv_states, cache_indices, activation: str | None = "silu",
                         pad_slot_id: int = -1):
    """One new token per sequence (`x` `[num_seqs, dim]`): its conv over the state `conv_states[cache_indices[i]]`
    then itself, and the state rolled by one token. Rows whose slot is `pad_slot_id` give zeros."""


@kernel_op(validate=check_gdn_gating, reference=_ref.gdn_gating, npu=_NPU)
def gdn_gating(A_log, a, b, dt_bias):  # noqa: N803
    """`(g, beta)` float32 `[num_tokens, value heads]`: `g = -exp(A_log) * softplus(a + dt_bias)` (the log decay),
    `beta = sigmoid(b)`."""


@kernel_op(validate=check_chunk_gated_delta_rule, reference=_ref.chunk_gated_delta_rule, npu=_NPU_CHUNK)
def chunk_gated_delta_rule(q, k, v, g, beta, ssm_states, query_start_loc, state_indices, has_initial_state,
                           scale: float, qk_l2norm: bool = True, chunk_size: int = 64):
    """The gated delta rule over each sequence (prefill chunks), from its recurrent state
    `ssm_states[state_indices[i]]` when `has_initial_state[i]` (else zeros), leaving its final state there. q, k
    `[num_tokens, key heads, head_k_dim]` (L2-normalised first when `qk_l2norm`), v `[num_tokens, value heads,
    head_v_dim]`, g (log decay) and beta `[num_tokens, value heads]`. Returns `[num_tokens, value heads,
    head_v_dim]` in v's dtype; `chunk_size` is the length the WY form works on (any length gives the same rule)."""


@kernel_op(validate=check_recurrent_gated_delta_rule, reference=_ref.recurrent_gated_delta_rule,
           npu=_NPU_RECURRENT)
def recurrent_gated_delta_rule(q, k, v, g, beta, ssm_states, state_indices, scale: float, qk_l2norm: bool = True,
                               pad_slot_id: int = -1):
    """One decode token per sequence: the gated delta rule's step from the state `ssm_states[state_indices[i]]`,
    written back in place. Shapes as `chunk_gated_delta_rule` with one token per sequence; rows whose slot is
    `pad_slot_id` give zeros and touch no state."""
