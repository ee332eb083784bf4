"""vLLM's punica wrapper (multi-LoRA) on `ascend_kernels`' LoRA ops, for both runners (`get_punica_wrapper`).

vLLM's LoRA layers call a punica wrapper for every LoRA'd linear, embedding and the logits. vLLM's CPU wrapper
(`PunicaWrapperCPU`) keeps the batch's adapter mapping and splits each call into shrink/expand steps; this subclass
keeps that plumbing and runs every step through the kernel facade: `sgmv_*` for prefill batches (one adapter per
request segment), `bgmv_*` per token for decode batches and the sampler's rows. (vLLM 0.32's runners, V1 and MRV2,
mark every batch a prefill batch, decode steps too: one-token segments through `sgmv_*`; `bgmv_*` then runs for the
logits.)

A token without an adapter (slot -1) gets no LoRA term here, as punica's GPU kernels give it. vLLM's CPU ops index
the weights with that -1, i.e. apply the last slot's adapter: plain vLLM CPU's wrong base-model tokens beside
adapter requests once that slot holds an adapter.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.lora.punica_wrapper.punica_cpu import PunicaWrapperCPU

from ascend_platform.facade import kernel_ops


def _segments(meta: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens per segment, slot per segment) of vLLM's prefill metadata (`PunicaWrapperBase.prefill_metadata`:
    start locations, lengths, slots, batch size, max length, token count)."""
    _, seq_lens, lora_indices, *_ = meta
    return seq_lens, lora_indices


class AscendPunicaWrapper(PunicaWrapperCPU):
    """`PunicaWrapperCPU`'s steps on `ascend_kernels.ops.{b,s}gmv_{shrink,expand}`."""

    def _shrink_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        if self.no_lora:  # no request of the batch has an adapter: the buffer stays zero
            return
        kernel_ops().sgmv_shrink(x, w_t_all, y, *_segments(self.prefill_metadata), scale)

    def _shrink_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, scale: float) -> None:
        kernel_ops().bgmv_shrink(x, w_t_all, y, self.token_lora_indices, scale)

    def _expand_prefill(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        self._expand_slice_prefill(y, x, w_t_all, 0, None, add_inputs)

    def _expand_decode(self, y: torch.Tensor, x: torch.Tensor, w_t_all: torch.Tensor, add_inputs: bool) -> None:
        self._expand_slice_decode(y, x, w_t_all, 0, None, add_inputs)

    def _expand_slice_prefill(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        w_t_all: torch.Tensor,
        y_offset: int,
        y_slice_size: int | None,
        add_inputs: bool,
    ) -> None:
        if self.no_lora:
            return
        kernel_ops().sgmv_expand(x, w_t_all, y, *_segments(self.prefill_metadata), y_offset, y_slice_size, add_inputs)

    def _expand_slice_decode(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        w_t_all: torch.Tensor,
        y_offset: int,
        y_slice_size: int | None,
        add_inputs: bool,
    ) -> None:
        kernel_ops().bgmv_expand(x, w_t_all, y, self.token_lora_indices, y_offset, y_slice_size, add_inputs)

    def add_lora_logits(
        self,
        y: torch.Tensor,
        x: torch.Tensor,
        lora_a_stacked: torch.Tensor,
        lora_b_stacked: torch.Tensor,
        scale,
        *,
        buffer: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> None:
        """`y += (x @ A^T * scale) @ B^T` per sampled row, by the sampler's slots (as `PunicaWrapperCPU`)."""
        y = y.view(-1, y.shape[-1])
        x = x.view(-1, x.shape[-1])
        if buffer is None:  # float32, as vLLM's wrappers make it
            buffer = torch.zeros((x.size(0), lora_b_stacked.size(-1)), dtype=torch.float32, device=x.device)
        ops = kernel_ops()
        ops.bgmv_shrink(x, lora_a_stacked, buffer, self.sampler_indices, scale)
        ops.bgmv_expand(buffer, lora_b_stacked, y, self.sampler_indices, 0, None, True)
