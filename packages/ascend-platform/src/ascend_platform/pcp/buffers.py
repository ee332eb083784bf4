"""Persistent rank-local input buffers of a PCP rank: allocated once, written in place every step and capture.

A captured graph (an ACL graph on an NPU) records tensor addresses, so the inputs of every later replay must live
in the same memory (vLLM PR 53515). `PCPInputBuffers` extends vLLM's MRV2 `InputBuffers` with what a PCP rank and
Ascend's kernels need besides: query offsets with room for a padding slot past the `max_num_reqs + 1` prefix-sum
view, sequence lengths on the host as well as the device, the rank-local block tables and the slot mappings of the
KV gathered across ranks (PR 53869). `addresses()` lists every buffer's data pointer so tests can prove they never
move.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from vllm.utils.platform_utils import is_pin_memory_available
from vllm.v1.attention.backends.utils import PAD_SLOT_ID
from vllm.v1.worker.gpu.input_batch import InputBuffers

# Ascend's fused attention reads the query offset one past the last (padded) request.
QUERY_PAD_SLOTS = 1


class PCPInputBuffers(InputBuffers):
    """vLLM's `InputBuffers` for a PCP rank's local batch, plus host sequence lengths, block tables, slot mappings.

    `max_num_reqs` counts local rows: a prefill contributes up to two (its head and tail chunks).
    """

    def __init__(
        self,
        max_num_reqs: int,
        max_num_tokens: int,
        device: torch.device,
        *,
        pcp_world_size: int,
        block_table_widths: Sequence[int] = (),
        query_pad_slots: int = QUERY_PAD_SLOTS,
    ):
        if max_num_reqs < 1 or max_num_tokens < 1:
            raise ValueError(
                f"PCP buffers need max_num_reqs and max_num_tokens >= 1, got {max_num_reqs}, {max_num_tokens}"
            )
        if query_pad_slots < 0:
            raise ValueError(f"query_pad_slots must be >= 0, got {query_pad_slots}")
        super().__init__(max_num_reqs, max_num_tokens, device)
        self.pcp_world_size = pcp_world_size
        self.query_pad_slots = query_pad_slots
        # vLLM writes a prefix sum of exactly max_num_reqs + 1 entries into `query_start_loc`, so that stays a view of
        # that length; the storage behind it is longer by the kernels' padding slots.
        self.query_start_loc_storage = torch.zeros(max_num_reqs + 1 + query_pad_slots, dtype=torch.int32, device=device)
        self.query_start_loc = self.query_start_loc_storage[: max_num_reqs + 1]
        self.seq_lens_cpu = torch.zeros(
            max_num_reqs, dtype=torch.int32, device="cpu", pin_memory=is_pin_memory_available()
        )
        self.block_tables: tuple[torch.Tensor, ...] = tuple(
            torch.zeros(max_num_reqs, width, dtype=torch.int32, device=device) for width in block_table_widths
        )
        self.block_table_ptrs = torch.tensor(
            [t.data_ptr() for t in self.block_tables], dtype=torch.uint64, device=device
        )
        num_groups = len(self.block_tables)
        # The whole step's slot mappings (global batch) and their expansion to the KV gathered from every rank.
        self.global_slot_mappings = torch.full(
            (num_groups, max_num_tokens), PAD_SLOT_ID, dtype=torch.int64, device=device
        )
        self.gathered_slot_mappings = torch.full(
            (num_groups, max_num_tokens * pcp_world_size), PAD_SLOT_ID, dtype=torch.int64, device=device
        )

    @property
    def num_kv_cache_groups(self) -> int:
        return len(self.block_tables)

    def addresses(self) -> dict[str, int]:
        """Data pointer of every persistent buffer, by name."""
        named = {
            "input_ids": self.input_ids,
            "positions": self.positions,
            "is_padding": self.is_padding,
            "query_start_loc": self.query_start_loc,
            "query_start_loc_storage": self.query_start_loc_storage,
            "seq_lens": self.seq_lens,
            "seq_lens_cpu": self.seq_lens_cpu,
            "dcp_local_seq_lens": self.dcp_local_seq_lens,
            "global_slot_mappings": self.global_slot_mappings,
            "gathered_slot_mappings": self.gathered_slot_mappings,
        }
        named.update({f"block_table[{i}]": t for i, t in enumerate(self.block_tables)})
        return {name: t.data_ptr() for name, t in named.items()}
