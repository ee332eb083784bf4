"""The reference's slot mapping on its native loop (`native/batch_prep.c`), when the call suits it: host tensors of
int32 / int64 with contiguous rows, and an output long enough for the batch's tokens. Otherwise (no library, another
device, a compile trace) `batch_prep.compute_slot_mapping`'s torch formulation runs."""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build
from ascend_kernels.reference.native_layers import host_index


def compute_slot_mapping(block_table, req_indices, query_start_loc, positions, block_size, out) -> bool:
    """Fill out as the torch formulation would; False (nothing written) when the loop does not take the call."""
    lib = native_build.library()
    if lib is None or torch.compiler.is_compiling():
        return False
    if not all(host_index(t) for t in (block_table, req_indices, query_start_loc, positions, out)):
        return False
    num_reqs = req_indices.shape[0]
    tokens = int(query_start_loc[num_reqs]) if num_reqs else 0
    if out.dtype != torch.int64 or tokens > out.shape[0] or tokens > positions.shape[0]:
        return False
    rc = lib.ak_slot_mapping(
        block_table.data_ptr(), int(block_table.dtype == torch.int64), block_table.stride(0), block_table.shape[1],
        req_indices.data_ptr(), int(req_indices.dtype == torch.int64), query_start_loc.data_ptr(),
        int(query_start_loc.dtype == torch.int64), num_reqs, positions.data_ptr(), int(positions.dtype == torch.int64),
        block_size, out.data_ptr(), out.shape[0],
    )
    if rc < 0:
        raise ValueError(f"compute_slot_mapping: query_start_loc[:{num_reqs + 1}] = "
                         f"{query_start_loc[: num_reqs + 1].tolist()} is not non-decreasing within out's "
                         f"{out.shape[0]} tokens")
    if rc > 0:
        raise IndexError(f"compute_slot_mapping: positions[{rc - 1}] = {int(positions[rc - 1])} reaches past the "
                         f"block table's {block_table.shape[1]} blocks of {block_size}")
    native_build.record("compute_slot_mapping")
    return True
