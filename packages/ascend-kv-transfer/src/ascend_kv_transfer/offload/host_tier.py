"""The worker's host tier: slot-addressed host buffers and zero-copy byte views over each layer's device blocks.

Each layer gets a `[num_blocks, page_bytes]` uint8 view aliasing its KV memory (no copy) and a host buffer of
`[num_slots, page_bytes]`; a run of consecutive blocks that maps to consecutive slots moves with one `copy_` per
layer. Layouts whose pages are not contiguous or overlap are refused by `describe_kv_caches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ascend_kv_transfer.kv_regions import KVRegions, describe_kv_caches
from ascend_kv_transfer.p2p.plan import coalesce_runs


def block_byte_view(tensor: torch.Tensor, block_stride: int, page_bytes: int, num_blocks: int) -> torch.Tensor:
    """A uint8 `[num_blocks, page_bytes]` view sharing `tensor`'s memory."""
    storage = tensor.untyped_storage()
    offset = tensor.data_ptr() - storage.data_ptr()
    view = torch.empty(0, dtype=torch.uint8, device=tensor.device)
    view.set_(storage, offset, (num_blocks, page_bytes), (block_stride, 1))
    return view


class HostTier:
    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_slots: int, num_blocks: int | None = None,
                 pin_memory: bool = False):
        self.regions: KVRegions = describe_kv_caches(kv_caches, num_blocks)
        if num_slots < 1:
            raise ValueError(f"num_slots={num_slots}")
        self.num_slots = num_slots
        self.device_views = [block_byte_view(kv_caches[r.name], r.block_stride, r.page_bytes, r.num_blocks)
                             for r in self.regions.regions]
        self.host = [torch.empty((num_slots, r.page_bytes), dtype=torch.uint8, pin_memory=pin_memory)
                     for r in self.regions.regions]
        self.copies = 0

    @property
    def bytes_per_block(self) -> int:
        return self.regions.bytes_per_block

    def store(self, slots: Sequence[int], blocks: Sequence[int]) -> int:
        """Copy device `blocks` into host `slots`; returns bytes moved."""
        return self._move(blocks, slots, to_host=True)

    def load(self, slots: Sequence[int], blocks: Sequence[int]) -> int:
        """Copy host `slots` into device `blocks`; returns bytes moved."""
        return self._move(blocks, slots, to_host=False)

    def _move(self, blocks: Sequence[int], slots: Sequence[int], *, to_host: bool) -> int:
        moved = 0
        for run in coalesce_runs(blocks, slots):
            b, s, n = run.local_start, run.remote_start, run.length
            for dev, host in zip(self.device_views, self.host, strict=True):
                if to_host:
                    host[s:s + n].copy_(dev[b:b + n])
                else:
                    dev[b:b + n].copy_(host[s:s + n])
                moved += n * host.shape[1]
                self.copies += 1
        return moved
