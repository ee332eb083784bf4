"""Ascend's MRV2 prefill-context-parallel manager: vLLM's `PCPManager` on persistent Ascend buffers.

vLLM's manager rewrites each step's global `InputBatch` into this rank's head-and-tail chunks
(`ascend_platform.pcp.partition`), pads it to the graph descriptor and restores the global hidden states before
sampling. Ascend's subclass changes five things:

* every input tensor lives in one `PCPInputBuffers` allocated at start-up, so captured graphs replay on the same
  addresses (vLLM PR 53515); capture batches are staged there too, and the capture block tables and slot mappings
  are rank-local views of it (PR 53869);
* the local batch is padded to the descriptor's token count but never below its real token count: a descriptor
  too small for the real tokens turns the step eager at the real count (the seed bug kept 76 of 151 tokens);
* the host copy of the sequence lengths is filled each step for kernels that take lengths on the host;
* each step it works out where this rank's prefill chunks find their keys in the all-gathered K/V
  (`attention_layout`, see `ascend_platform.pcp.layout`), which the Ascend attention backend reads;
* the configuration check is Ascend's (`validate_pcp_config`), and constructor/partition keywords go through
  `ascend_core.upstream.pcp`, so the class works with each lane's upstream manager.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from vllm.config import CUDAGraphMode
from vllm.logger import init_logger
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBatch
from vllm.v1.worker.gpu.pcp_manager import PCPManager

from ascend_core.upstream.pcp import pcp_has_capture_buffers, pcp_init_kwargs, pcp_partition_kwargs
from ascend_platform import usage
from ascend_platform.pcp.buffers import QUERY_PAD_SLOTS, PCPInputBuffers
from ascend_platform.pcp.layout import PCPAttentionLayout, build_layout, canonical_gather_index
from ascend_platform.pcp.partition import local_tokens_after_padding, rank_token_counts
from ascend_platform.pcp.validation import validate_pcp_config

logger = init_logger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PCPStepPlan:
    """What one partition step decided, for the runner and for logs."""

    real_tokens_per_rank: tuple[int, ...]
    descriptor_tokens: int | None  # the graph descriptor's token count as dispatched; None when eager
    local_tokens_after_padding: int  # this rank's padded local batch, >= every rank's real count
    widened: bool  # the descriptor was smaller than the real tokens, so the step runs eagerly at the real count
    descriptor_mode: str = "NONE"  # the graph mode the step was dispatched with
    prefill_rows: int = 0  # this rank's prefill chunks (attended over the all-gathered K/V)
    context_rows: int = 0  # of which continue a context (their attention merges the cached part)
    buffers_in_place: bool = True  # the local batch's tensors are views of the persistent buffers

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


STEP_LOG_LENGTH = 256


class AscendPCPManager(PCPManager):
    """vLLM's MRV2 `PCPManager` on `PCPInputBuffers`; never truncates real tokens to a graph descriptor."""

    def __init__(
        self,
        pcp_world_size: int,
        pcp_rank: int,
        device: torch.device,
        shard_decode_requests: bool = False,
        max_num_reqs: int | None = None,
        max_num_tokens: int | None = None,
        block_tables: Any = None,
        dcp_world_size: int = 1,
        dcp_rank: int = 0,
        cp_interleave: int = 1,
        *,
        max_num_blocks_per_group: Sequence[int] | None = None,
        query_pad_slots: int = QUERY_PAD_SLOTS,
        **lane_kwargs: Any,
    ) -> None:
        if max_num_reqs is None or max_num_tokens is None:
            raise ValueError(
                "AscendPCPManager needs max_num_reqs and max_num_tokens to size its persistent buffers "
                f"(got max_num_reqs={max_num_reqs}, max_num_tokens={max_num_tokens}); pass the scheduler's "
                "max_num_seqs and max_num_batched_tokens"
            )
        if not 0 <= pcp_rank < pcp_world_size:
            raise ValueError(f"pcp_rank {pcp_rank} is outside the PCP group of size {pcp_world_size}")
        if dcp_world_size > 1:
            raise ValueError(
                f"AscendPCPManager does not support decode context parallel (dcp_world_size={dcp_world_size}); "
                "validate_pcp_config rejects this configuration"
            )
        candidates = dict(
            pcp_world_size=pcp_world_size,
            pcp_rank=pcp_rank,
            device=device,
            shard_decode_requests=shard_decode_requests,
            block_tables=block_tables,
            dcp_world_size=dcp_world_size,
            dcp_rank=dcp_rank,
            cp_interleave=cp_interleave,
            **lane_kwargs,
        )
        # Sizes are withheld from the upstream constructor so it allocates no buffers of its own: ours replace them.
        super().__init__(**pcp_init_kwargs(candidates, PCPManager.__init__))
        if block_tables is not None:
            widths = [t.shape[1] for t in block_tables.input_block_tables]
        else:
            widths = list(max_num_blocks_per_group or ())
        # Set here too: an earlier lane's constructor may not keep them.
        self.pcp_world_size, self.pcp_rank = pcp_world_size, pcp_rank
        self.max_num_reqs = max_num_reqs
        self.shard_decode_requests = shard_decode_requests
        # A prefill puts up to two rows (head and tail chunk) into a rank's local batch.
        self.buffers = PCPInputBuffers(
            2 * max_num_reqs,
            max_num_tokens,
            device,
            pcp_world_size=pcp_world_size,
            block_table_widths=widths,
            query_pad_slots=query_pad_slots,
        )
        self._block_tables = block_tables
        self._input_buffers = self.buffers
        self._local_block_tables = self.buffers.block_tables
        self._local_block_table_ptrs = self.buffers.block_table_ptrs
        self._global_batch_slot_mappings = self.buffers.global_slot_mappings if widths else None
        self._gathered_kv_slot_mappings = self.buffers.gathered_slot_mappings if widths else None
        self.last_plan: PCPStepPlan | None = None
        self.attention_layout: PCPAttentionLayout | None = None
        self.initial_addresses = self.buffers.addresses()
        self.step_log: collections.deque[PCPStepPlan] = collections.deque(maxlen=STEP_LOG_LENGTH)
        self._segments_by_rank: list | None = None

    # --- configuration -------------------------------------------------------------------------------------------

    @staticmethod
    def validate_config(vllm_config: Any, supports_mm_inputs: bool) -> None:
        validate_pcp_config(vllm_config, supports_mm_inputs)

    # --- per step ------------------------------------------------------------------------------------------------

    def num_tokens_for_dispatch(self, num_scheduled_tokens: np.ndarray, is_prefilling: np.ndarray) -> int:
        """The largest real rank-local token count of a step: what a graph descriptor must be chosen for."""
        counts = rank_token_counts(
            num_scheduled_tokens,
            is_prefilling,
            self.pcp_world_size,
            shard_decode_requests=self.shard_decode_requests,
        )
        return int(counts.max()) if counts.size else 0

    # vLLM's runner calls it by this name.
    get_num_tokens_for_dispatch = num_tokens_for_dispatch

    def effective_descriptor(self, input_batch: InputBatch, batch_desc: Any) -> Any:
        """`batch_desc`, or an eager descriptor at the real token count when there is none or it is too small."""
        real = self.num_tokens_for_dispatch(input_batch.num_scheduled_tokens, input_batch.is_prefilling_np)
        if batch_desc is None:  # eager step: pad only to the largest rank's real count
            return BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=real, num_reqs=None)
        if not batch_desc.cg_mode:
            return batch_desc
        if local_tokens_after_padding(real, batch_desc.num_tokens) == batch_desc.num_tokens:
            return batch_desc
        logger.debug(
            "PCP local batch of %d real tokens exceeds the %s descriptor of %d tokens: running eagerly",
            real,
            batch_desc.cg_mode,
            batch_desc.num_tokens,
        )
        fields = {f.name for f in dataclasses.fields(batch_desc)}
        changes: dict[str, Any] = {"cg_mode": CUDAGraphMode.NONE, "num_tokens": real}
        if "num_reqs" in fields:
            changes["num_reqs"] = None
        return dataclasses.replace(batch_desc, **changes)

    def partition_batch(
        self, input_batch: InputBatch, batch_desc: Any = None, *, padded_num_tokens: int | None = None
    ) -> InputBatch:
        """This rank's local batch of `input_batch`, padded to `batch_desc` but never below its real tokens.

        `padded_num_tokens` is the earlier lane's form of a PIECEWISE descriptor (a bare padded token count).
        """
        if batch_desc is None and padded_num_tokens is not None:
            batch_desc = BatchExecutionDescriptor(
                cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=padded_num_tokens, num_reqs=None
            )
        real = rank_token_counts(
            input_batch.num_scheduled_tokens,
            input_batch.is_prefilling_np,
            self.pcp_world_size,
            shard_decode_requests=self.shard_decode_requests,
        )
        effective = self.effective_descriptor(input_batch, batch_desc)
        local = super().partition_batch(input_batch, **pcp_partition_kwargs(effective, super().partition_batch))
        descriptor_tokens = batch_desc.num_tokens if batch_desc is not None and batch_desc.cg_mode else None
        padded = local.num_tokens_after_padding
        if padded < int(real.max()):  # the upstream contract we rely on; never let a rank lose tokens silently
            raise RuntimeError(f"PCP local batch padded to {padded} tokens holds fewer than the real {int(real.max())}")
        self.attention_layout = self._attention_layout(input_batch, padded)
        layout = self.attention_layout
        in_place = self._in_place(local)
        self.last_plan = PCPStepPlan(
            real_tokens_per_rank=tuple(int(x) for x in real),
            descriptor_tokens=descriptor_tokens,
            local_tokens_after_padding=padded,
            widened=batch_desc is not None and effective is not batch_desc,
            descriptor_mode=effective.cg_mode.name if effective is not None else "NONE",
            prefill_rows=layout.num_prefill_rows if layout is not None else 0,
            context_rows=layout.context_rows if layout is not None else 0,
            buffers_in_place=in_place,
        )
        self.step_log.append(self.last_plan)
        usage.count("pcp.steps")
        if not in_place:
            usage.count("pcp.buffers_moved")
        n = local.num_reqs_after_padding
        host = self.buffers.seq_lens_cpu
        host[:n].copy_(local.seq_lens_cpu_upper_bound[:n])
        host[n:].zero_()
        return local

    def _build_batch_layout(self, num_scheduled_tokens, num_computed_tokens, is_prefilling, query_start_loc_np,
                            padded_num_tokens=None):
        segments_by_rank, per_rank = super()._build_batch_layout(
            num_scheduled_tokens, num_computed_tokens, is_prefilling, query_start_loc_np,
            padded_num_tokens=padded_num_tokens)
        self._segments_by_rank = segments_by_rank  # the attention layout reads every rank's segments
        return segments_by_rank, per_rank

    def _canonical(self, global_batch: InputBatch) -> list[list[bool]]:
        """Per rank and segment: whether that copy of the tokens is the one written (vLLM's rule for replicas)."""
        assert self._segments_by_rank is not None
        prefilling = global_batch.is_prefilling_np
        replicated = self.replicated_requests(global_batch.num_scheduled_tokens, prefilling)
        keep = []
        for rank, segments in enumerate(self._segments_by_rank):
            row = []
            for seg in segments:
                g = seg.global_batch_req_idx
                sharded_decode = not bool(prefilling[g]) and self.shard_decode_requests
                row.append(not (replicated[g] and not sharded_decode and rank != 0))
            keep.append(row)
        return keep

    def _attention_layout(self, global_batch: InputBatch, padded: int) -> PCPAttentionLayout | None:
        if self._segments_by_rank is None:
            return None
        local = self._segments_by_rank[self.pcp_rank]
        if not any(bool(global_batch.is_prefilling_np[s.global_batch_req_idx]) for s in local):
            return None
        qsl = global_batch.query_start_loc_np
        gather_index = canonical_gather_index(self._segments_by_rank, padded, int(qsl[global_batch.num_reqs]),
                                              self._canonical(global_batch))
        return build_layout(local, gather_index, query_start_loc_np=qsl,
                            num_computed_tokens_np=global_batch.num_computed_tokens_np,
                            is_prefilling_np=global_batch.is_prefilling_np, device=self.device)

    def _in_place(self, local: InputBatch) -> bool:
        a = self.initial_addresses
        return (local.input_ids.data_ptr() == a["input_ids"] and local.positions.data_ptr() == a["positions"]
                and local.query_start_loc.data_ptr() == a["query_start_loc"]
                and local.seq_lens.data_ptr() == a["seq_lens"] and self.buffers.addresses() == a)

    @property
    def restore_index(self) -> torch.Tensor | None:
        """Index that turns the all-gathered padded rank outputs back into the global batch's token order."""
        return self._hidden_restore_idx

    # --- capture -------------------------------------------------------------------------------------------------

    def prepare_inputs_to_capture(self, input_batch: InputBatch) -> InputBatch:
        """Stage a capture or dummy batch in the persistent buffers (copies are skipped where it already lives)."""
        self.attention_layout = None  # dummy rows attend over the KV replica only
        if pcp_has_capture_buffers(PCPManager):
            staged = super().prepare_inputs_to_capture(input_batch)
        else:
            b = self.buffers
            n, r = input_batch.num_tokens_after_padding, input_batch.num_reqs_after_padding
            staged = dataclasses.replace(
                input_batch,
                input_ids=b.input_ids[:n].copy_(input_batch.input_ids),
                positions=b.positions[:n].copy_(input_batch.positions),
                is_padding=b.is_padding[:n].copy_(input_batch.is_padding),
                query_start_loc=b.query_start_loc[: r + 1].copy_(input_batch.query_start_loc),
                seq_lens=b.seq_lens[:r].copy_(input_batch.seq_lens),
            )
        r = staged.num_reqs_after_padding
        self.buffers.seq_lens_cpu[:r].copy_(staged.seq_lens)
        self.buffers.seq_lens_cpu[r:].zero_()
        return staged

    def get_dummy_block_tables(self, num_reqs: int) -> tuple[torch.Tensor, ...]:
        """Zeroed rank-local block-table rows for a capture batch: views of the persistent tables."""
        if num_reqs > self.buffers.max_num_reqs:
            raise ValueError(f"capture batch of {num_reqs} requests exceeds the {self.buffers.max_num_reqs} local rows")
        return tuple(t[:num_reqs].zero_() for t in self.buffers.block_tables)

    def get_dummy_slot_mappings(self, num_tokens: int) -> torch.Tensor:
        """Padding slot mappings for the KV gathered from every rank during capture: a view of the persistent tensor."""
        if num_tokens > self.buffers.max_num_tokens:
            raise ValueError(f"capture batch of {num_tokens} tokens exceeds the {self.buffers.max_num_tokens} buffer")
        # Fill all of it: kernels may read past the requested range while padding.
        self.buffers.gathered_slot_mappings.fill_(PAD_SLOT_ID)
        return self.buffers.gathered_slot_mappings[:, : num_tokens * self.pcp_world_size]

    def stage_capture_batch(self, num_tokens: int, num_reqs: int | None = None) -> CaptureInputs:
        """Everything a graph capture of `num_tokens` local tokens reads, staged in the persistent buffers."""
        num_reqs = num_reqs or min(num_tokens, self.max_num_reqs)
        batch = InputBatch.make_dummy(num_reqs, num_tokens, self.buffers)
        batch = self.prepare_inputs_to_capture(batch)
        return CaptureInputs(
            batch=batch,
            block_tables=self.get_dummy_block_tables(num_reqs),
            slot_mappings=self.get_dummy_slot_mappings(num_tokens),
        )


@dataclasses.dataclass(frozen=True)
class CaptureInputs:
    batch: InputBatch
    block_tables: tuple[torch.Tensor, ...]
    slot_mappings: torch.Tensor
