"""Turning block id lists into as few Mooncake transfer entries as possible, and chunking them under the limit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p.schema import LayerRegion


@dataclass(frozen=True)
class Run:
    """`length` blocks starting at `local_start` here and `remote_start` on the peer, both consecutive."""

    local_start: int
    remote_start: int
    length: int


def coalesce_runs(local_ids: Sequence[int], remote_ids: Sequence[int]) -> list[Run]:
    """Group position-wise pairs into runs where both sides' ids advance by one."""
    if len(local_ids) != len(remote_ids):
        raise ValueError(f"{len(local_ids)} local blocks vs {len(remote_ids)} remote blocks")
    runs: list[Run] = []
    for local, remote in zip(local_ids, remote_ids, strict=True):
        if runs:
            last = runs[-1]
            if local == last.local_start + last.length and remote == last.remote_start + last.length:
                runs[-1] = Run(last.local_start, last.remote_start, last.length + 1)
                continue
        runs.append(Run(local, remote, 1))
    return runs


@dataclass
class Entries:
    """Parallel lists as Mooncake's batch calls take them."""

    local: list[int]
    remote: list[int]
    lengths: list[int]
    # Bytes per layer (what each cache kind of a hybrid model moved, for stats and tests).
    layer_bytes: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def nbytes(self) -> int:
        return sum(self.lengths)


def build_entries(pairs: Sequence[tuple[LayerRegion, LayerRegion]], runs: Sequence[Run]) -> Entries:
    """One entry per (layer, run) when both sides store the run's pages back to back, else one per page."""
    entries = Entries([], [], [])
    for mine, theirs in pairs:
        dense = mine.block_stride == mine.page_bytes and theirs.block_stride == theirs.page_bytes
        moved = sum(run.length for run in runs) * mine.page_bytes
        if moved:
            entries.layer_bytes[mine.owner] = entries.layer_bytes.get(mine.owner, 0) + moved
        for run in runs:
            if run.local_start + run.length > mine.num_blocks or run.remote_start + run.length > theirs.num_blocks:
                raise ValueError(f"block run {run} outside layer {mine.name!r} "
                                 f"({mine.num_blocks} local / {theirs.num_blocks} remote blocks)")
            if dense:
                entries.local.append(mine.base_addr + run.local_start * mine.block_stride)
                entries.remote.append(theirs.base_addr + run.remote_start * theirs.block_stride)
                entries.lengths.append(run.length * mine.page_bytes)
                continue
            for i in range(run.length):
                entries.local.append(mine.base_addr + (run.local_start + i) * mine.block_stride)
                entries.remote.append(theirs.base_addr + (run.remote_start + i) * theirs.block_stride)
                entries.lengths.append(mine.page_bytes)
    return entries


def chunk(entries: Entries, max_entries: int) -> list[Entries]:
    """Split into batches of at most `max_entries` (Mooncake's per-peer queue would reject a bigger one)."""
    if max_entries < 1:
        raise ValueError(f"max_entries={max_entries}")
    return [Entries(entries.local[i:i + max_entries], entries.remote[i:i + max_entries],
                    entries.lengths[i:i + max_entries]) for i in range(0, len(entries), max_entries)]


def merge(parts: Sequence[Entries]) -> Entries:
    """One batch of several plans' entries (e.g. one per KV cache group), their per-layer bytes summed."""
    out = Entries([], [], [])
    for part in parts:
        out.local += part.local
        out.remote += part.remote
        out.lengths += part.lengths
        for name, nbytes in part.layer_bytes.items():
            out.layer_bytes[name] = out.layer_bytes.get(name, 0) + nbytes
    return out


def plan_groups(pairs: Sequence[tuple[LayerRegion, LayerRegion]], local: Sequence[Sequence[int]],
                remote: Sequence[Sequence[int]]) -> Entries:
    """The reads that fill our blocks `local` (per KV cache group) from the peer's `remote`, layer pairs by group.

    Our blocks take the tail of the peer's: leading blocks we already had (prefix hits) are not in `local`, and in a
    sliding-window group neither side lists blocks before its window as real (vLLM freed them: the peer lists them
    as its null block, we skip them), so the window's blocks line up from the end.
    """
    parts: list[Entries] = []
    for group, local_ids in enumerate(local):
        if not local_ids:
            continue
        if group >= len(remote) or len(remote[group]) < len(local_ids):
            have = len(remote[group]) if group < len(remote) else 0
            raise RuntimeError(f"group {group}: {len(local_ids)} blocks to load but the peer holds {have}")
        tail = remote[group][len(remote[group]) - len(local_ids):]
        group_pairs = [(mine, theirs) for mine, theirs in pairs if mine.group == group]
        parts.append(build_entries(group_pairs, coalesce_runs(local_ids, tail)))
    return merge(parts)
