"""Punica's multi-LoRA ops of the kernel facade: shrink and expand, per token (bgmv: decode steps and the sampler's
rows) and per request segment (sgmv: prefill, one adapter per segment), as vLLM's punica wrappers call them.

Adapter weights are vLLM's stacked slots: LoRA A `[max_loras, (1,) rank, hidden_in]`, LoRA B `[max_loras, (1,)
hidden_out, rank]`. A slot index of -1 means no adapter for that token (or segment).

On an NPU the reference runs on the device: torch_npu 2.13.0 declares no LoRA op (no bgmv/sgmv schema in the
wheel); vllm-ascend's `bgmv_shrink` / `bgmv_expand` / `sgmv_shrink` / `sgmv_expand` are custom ops of its own CANN
kernels (`torch.ops._C_ascend`), not torch_npu's, so a card here runs these einsums (counted per backend by the
facade's usage counting, `npu:<op>`).
"""

from __future__ import annotations

import torch

from ascend_kernels import validation as _v
from ascend_kernels.op_registry import kernel_op, reference_on_device
from ascend_kernels.reference import lora as _ref

_NPU_NOTE = (
    "torch_npu 2.13.0 has no LoRA op (no bgmv/sgmv schema); vllm-ascend's are its own CANN custom ops "
    "(torch.ops._C_ascend), so the reference's einsum runs on the NPU"
)


def _weights(op: str, weights, x) -> torch.Tensor:
    expected = "stacked adapter slots [max_loras, (1,) out, in] of a floating dtype"
    if (
        not isinstance(weights, torch.Tensor)
        or weights.dim() not in (3, 4)
        or (weights.dim() == 4 and weights.shape[1] != 1)
    ):
        _v.fail(op, "weights", weights, expected)
    _v.floating(op, "weights", weights, expected)
    _v.same_device(op, "weights", weights, x.device, expected)
    if weights.shape[-1] != x.shape[1]:
        _v.fail(op, "weights", weights, f"{expected} with in = x's {x.shape[1]} columns")
    return weights


def _rows(op: str, x, out) -> None:
    _v.tensor(op, "x", x, 2, "[num_tokens, in]")
    _v.floating(op, "x", x, "[num_tokens, in]")
    _v.tensor(op, "out", out, 2, "[num_tokens, out_width]")
    _v.floating(op, "out", out, "[num_tokens, out_width]")
    _v.same_device(op, "out", out, x.device, "[num_tokens, out_width]")
    if out.shape[0] != x.shape[0]:
        _v.fail(op, "out", out, f"[num_tokens={x.shape[0]}, out_width] (x's rows)")


def _token_indices(op: str, indices, x) -> None:
    _v.index(op, "indices", indices, 1, f"[num_tokens={x.shape[0]}] slot per token (-1: none)")
    _v.same_device(op, "indices", indices, x.device, "[num_tokens] slot per token")
    if indices.shape[0] != x.shape[0]:
        _v.fail(op, "indices", indices, f"[num_tokens={x.shape[0]}] slot per token (-1: none)")


def _segments(op: str, seq_lens, lora_indices, x) -> None:
    _v.index(op, "seq_lens", seq_lens, 1, "[num_segments] tokens per segment")
    _v.index(op, "lora_indices", lora_indices, 1, "[num_segments] slot per segment (-1: none)")
    for name, t in (("seq_lens", seq_lens), ("lora_indices", lora_indices)):
        _v.same_device(op, name, t, x.device, "[num_segments]")
    if lora_indices.shape[0] != seq_lens.shape[0]:
        _v.fail(op, "lora_indices", lora_indices, f"[num_segments={seq_lens.shape[0]}] (seq_lens' length)")


def _shrink_width(op: str, weights, out) -> None:
    rank = weights.shape[-2]
    if out.shape[1] < rank:
        _v.fail(op, "out", out, f"[num_tokens, >= rank={rank}]")


def _expand_slice(op: str, weights, out, offset, size) -> None:
    _v.number(op, "offset", offset, "a column offset >= 0")
    if isinstance(offset, float) or offset < 0 or offset > out.shape[1]:
        _v.fail(op, "offset", offset, f"an int column offset in [0, {out.shape[1]}]")
    if size is None:
        return
    if (
        isinstance(size, bool)
        or not isinstance(size, int)
        or size < 0
        or offset + size > out.shape[1]
        or size > weights.shape[-2]
    ):
        _v.fail(
            op,
            "size",
            size,
            f"None or an int slice width with offset + size <= {out.shape[1]} and size <= "
            f"the weights' out={weights.shape[-2]}",
        )


def check_bgmv_shrink(x, weights, out, indices, scale) -> None:
    op = "bgmv_shrink"
    _rows(op, x, out)
    _shrink_width(op, _weights(op, weights, x), out)
    _token_indices(op, indices, x)
    _v.number(op, "scale", scale, "a real scale")


def check_bgmv_expand(x, weights, out, indices, offset, size) -> None:
    op = "bgmv_expand"
    _rows(op, x, out)
    _expand_slice(op, _weights(op, weights, x), out, offset, size)
    _token_indices(op, indices, x)


def check_sgmv_shrink(x, weights, out, seq_lens, lora_indices, scale) -> None:
    op = "sgmv_shrink"
    _rows(op, x, out)
    _shrink_width(op, _weights(op, weights, x), out)
    _segments(op, seq_lens, lora_indices, x)
    _v.number(op, "scale", scale, "a real scale")


def check_sgmv_expand(x, weights, out, seq_lens, lora_indices, offset, size) -> None:
    op = "sgmv_expand"
    _rows(op, x, out)
    _expand_slice(op, _weights(op, weights, x), out, offset, size)
    _segments(op, seq_lens, lora_indices, x)


@kernel_op(validate=check_bgmv_shrink, reference=_ref.bgmv_shrink, npu=reference_on_device("lora", _NPU_NOTE))
def bgmv_shrink(x, weights, out, indices, scale: float = 1.0) -> None:
    """LoRA A per token: `out[t, :rank] = scale * x[t] @ weights[indices[t]]^T`, zeros where `indices[t]` is -1.
    `weights` `[max_loras, (1,) rank, in]`; `out` is written in its own dtype (vLLM passes a float32 buffer)."""


@kernel_op(validate=check_bgmv_expand, reference=_ref.bgmv_expand, npu=reference_on_device("lora", _NPU_NOTE))
def bgmv_expand(x, weights, out, indices, offset: int = 0, size: int | None = None, add_inputs: bool = True) -> None:
    """LoRA B per token into the column slice `[offset, offset + size)` of `out`: `x[t] @ weights[indices[t]]^T`
    (computed in `out`'s dtype), added to the slice (`add_inputs`) or written over it; rows whose index is -1 are
    left as they are. `size` None: every column the weights and `out` share from `offset` (an adapter may pad its
    output, e.g. the vocabulary, differently from the model)."""


@kernel_op(validate=check_sgmv_shrink, reference=_ref.sgmv_shrink, npu=reference_on_device("lora", _NPU_NOTE))
def sgmv_shrink(x, weights, out, seq_lens, lora_indices, scale: float = 1.0) -> None:
    """`bgmv_shrink` with one slot per segment of consecutive tokens: segment i is the next `seq_lens[i]` rows of
    `x` (the segments cover every row) and takes slot `lora_indices[i]`."""


@kernel_op(validate=check_sgmv_expand, reference=_ref.sgmv_expand, npu=reference_on_device("lora", _NPU_NOTE))
def sgmv_expand(
    x, weights, out, seq_lens, lora_indices, offset: int = 0, size: int | None = None, add_inputs: bool = True
) -> None:
    """`bgmv_expand` with one slot per segment of consecutive tokens (as `sgmv_shrink`)."""
