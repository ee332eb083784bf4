"""Where one pool object's bytes live in this worker's KV memory: a block's pages of every layer of a KV cache group.

An object is the group's layer pages for one block, in the group's layer order. Pages of consecutive layers that
are back to back in memory for every block (same block stride, one page's end is the next page's start, as in
block-major layouts) are coalesced into one buffer, so a get or put names as few buffers per key as the layout
allows; with layer-major layouts (`LBHNC`) it is one buffer per layer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ascend_kv_transfer.p2p.schema import LayerRegion


@dataclass(frozen=True)
class Segment:
    """`length` bytes at `base + block * stride` for block `block`."""

    base: int
    stride: int
    length: int


def coalesce(regions: Sequence[LayerRegion]) -> list[Segment]:
    segments: list[Segment] = []
    for r in regions:
        if segments:
            last = segments[-1]
            if last.stride == r.block_stride and last.base + last.length == r.base_addr:
                segments[-1] = Segment(last.base, last.stride, last.length + r.page_bytes)
                continue
        segments.append(Segment(r.base_addr, r.block_stride, r.page_bytes))
    return segments


class BlockLayout:
    """Per KV cache group: the coalesced segments of one block, and the object size."""

    def __init__(self, regions: Sequence[LayerRegion], layer_order: Mapping[int, Sequence[str]]):
        by_layer: dict[str, list[LayerRegion]] = {}
        for r in regions:  # a planar layer has a region per plane, in plane order
            by_layer.setdefault(r.owner, []).append(r)
        self.segments: dict[int, list[Segment]] = {}
        self.num_blocks: dict[int, int] = {}
        for group, names in sorted(layer_order.items()):
            ordered = [r for n in names for r in by_layer.get(n, ())]
            if not ordered:
                raise ValueError(f"KV cache group {group} has no KV memory on this worker (layers {list(names)[:4]})")
            self.segments[group] = coalesce(ordered)
            self.num_blocks[group] = min(r.num_blocks for r in ordered)
        self.groups = sorted(self.segments)

    def object_bytes(self, group: int) -> int:
        return sum(s.length for s in self.segments[group])

    def buffers(self, group: int, block_id: int) -> tuple[list[int], list[int]]:
        """(addresses, sizes) of block `block_id`'s object in `group`."""
        if not 0 <= block_id < self.num_blocks[group]:
            raise ValueError(f"block {block_id} outside KV cache group {group} ({self.num_blocks[group]} blocks)")
        segs = self.segments[group]
        return [s.base + block_id * s.stride for s in segs], [s.length for s in segs]
