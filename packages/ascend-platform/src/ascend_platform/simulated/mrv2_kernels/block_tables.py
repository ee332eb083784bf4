"""Model Runner V2's block tables for the simulated lane: gather and slot mapping without Triton.

vLLM's `BlockTables` launches `_gather_block_tables_kernel` and `_compute_slot_mappings_kernel` every step and, for
several KV cache groups, a fused staged-write kernel; all three address the per-group tables through a tensor of raw
device pointers and size part of their work by the launch grid, which a kernel-level stand-in never sees. So the
simulated MRV2 runner builds this subclass instead (the scoped patch `mrv2.block_tables`): the gather is an indexed
copy, slot mapping is `ascend_kernels.ops.compute_slot_mapping`, and multi-group writes go group by group.
Context parallelism (cp_size > 1) keeps vLLM's kernel.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.block_table import BlockTables

from ascend_platform import usage
from ascend_platform.facade import kernel_ops
from ascend_platform.simulated.mrv2_kernels import host_batch

PAD_SLOT = -1


class SimulatedBlockTables(BlockTables):
    def apply_staged_writes(self) -> None:
        if self.num_kv_cache_groups <= 1:
            super().apply_staged_writes()
            return
        for table in self.block_tables:
            table.apply_write()
        self.num_blocks.copy_to_uva()

    def gather_block_tables(self, idx_mapping: torch.Tensor, num_reqs_padded: int,
                            out: tuple[torch.Tensor, ...] | None = None,
                            out_ptrs: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        if self.num_kv_cache_groups == 0:
            return ()
        dst_tables = tuple(self.input_block_tables) if out is None else out
        usage.count("mrv2_kernels.gather_block_tables")
        sources = [src.gpu for src in self.block_tables]
        if host_batch.gather_block_tables(sources, self.num_blocks.gpu, idx_mapping, dst_tables, num_reqs_padded):
            return tuple(t[:num_reqs_padded] for t in dst_tables)
        num_reqs = idx_mapping.shape[0]
        reqs = idx_mapping.long()
        for group, (src, dst) in enumerate(zip(self.block_tables, dst_tables, strict=True)):
            if num_reqs:
                rows = src.gpu[reqs]
                filled = torch.arange(rows.shape[1], device=rows.device) < self.num_blocks.gpu[group, reqs, None]
                dst[:num_reqs] = torch.where(filled, rows, dst[:num_reqs])
            dst[num_reqs:num_reqs_padded].zero_()
        return tuple(t[:num_reqs_padded] for t in dst_tables)

    def compute_slot_mappings(self, idx_mapping: torch.Tensor, query_start_loc: torch.Tensor,
                              positions: torch.Tensor, num_tokens_padded: int,
                              out: torch.Tensor | None = None) -> torch.Tensor:
        if self.cp_size != 1 or self.num_kv_cache_groups == 0:
            return super().compute_slot_mappings(idx_mapping, query_start_loc, positions, num_tokens_padded, out)
        slot_mappings = self.slot_mappings if out is None else out
        ops = kernel_ops()
        for group, table in enumerate(self.block_tables):
            if not self._slot_mapping_enabled[group]:
                slot_mappings[group].fill_(PAD_SLOT)
                continue
            ops.compute_slot_mapping(table.gpu, idx_mapping, query_start_loc, positions,
                                     self.block_sizes[group], out=slot_mappings[group])
        return slot_mappings[:, :num_tokens_padded]
