"""Punica's LoRA ops in pure torch: shrink (`x @ A^T * scale`, hidden to rank) and expand (`x @ B^T`, rank to
hidden, into a column slice of the output), per token (bgmv: decode, the sampler) or per request segment (sgmv:
prefill, each segment's tokens one adapter).

Adapter weights are vLLM's stacked slots `[max_loras, (1,) out, in]`. A token whose slot index is -1 has no adapter:
shrink writes zeros to its row and expand leaves its row as it was, as punica's GPU kernels do. (vLLM's own torch ops
index the weights with the -1, i.e. apply the last slot's adapter to those tokens: plain vLLM CPU's wrong base-model
tokens beside adapter requests.)
"""

from __future__ import annotations

import torch


def _slots(weights: torch.Tensor) -> torch.Tensor:
    return weights.squeeze(1) if weights.dim() == 4 else weights


def _per_token(x: torch.Tensor, weights: torch.Tensor, indices: torch.Tensor, dtype: torch.dtype):
    """(rows with an adapter, each such row's x @ its slot's weight^T in `dtype`)."""
    rows = torch.nonzero(indices >= 0).flatten()
    w = _slots(weights)[indices[rows]].to(dtype)
    return rows, torch.einsum("bi,boi->bo", x[rows].to(dtype), w)


def bgmv_shrink(
    x: torch.Tensor, weights: torch.Tensor, out: torch.Tensor, indices: torch.Tensor, scale: float = 1.0
) -> None:
    out[:, : _slots(weights).shape[1]] = 0
    rows, y = _per_token(x, weights, indices, out.dtype)
    out[rows, : y.shape[1]] = scale * y


def bgmv_expand(
    x: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    indices: torch.Tensor,
    offset: int = 0,
    size: int | None = None,
    add_inputs: bool = True,
) -> None:
    rows, y = _per_token(x, weights, indices, out.dtype)
    # An adapter and the model may pad the output differently (the vocabulary of the logits): the common columns.
    width = min(y.shape[1], out.shape[1] - offset) if size is None else size
    target = out[:, offset : offset + width]
    if add_inputs:
        target[rows] += y[:, :width]
    else:
        target[rows] = y[:, :width]


def _token_indices(seq_lens: torch.Tensor, lora_indices: torch.Tensor) -> torch.Tensor:
    return torch.repeat_interleave(lora_indices, seq_lens)


def sgmv_shrink(
    x: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    lora_indices: torch.Tensor,
    scale: float = 1.0,
) -> None:
    bgmv_shrink(x, weights, out, _token_indices(seq_lens, lora_indices), scale)


def sgmv_expand(
    x: torch.Tensor,
    weights: torch.Tensor,
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    lora_indices: torch.Tensor,
    offset: int = 0,
    size: int | None = None,
    add_inputs: bool = True,
) -> None:
    bgmv_expand(x, weights, out, _token_indices(seq_lens, lora_indices), offset, size, add_inputs)
