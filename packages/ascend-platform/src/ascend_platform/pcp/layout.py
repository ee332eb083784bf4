"""Where each of a rank's prefill chunks finds its keys under PCP: the step's attention layout, one per step.

A rank's local batch holds decode rows first, then prefill chunks (the head and tail chunks of each prefill). Every
rank writes the K/V all-gathered from all ranks into its own replica of the KV cache, so a decode row simply reads
the cache. A prefill chunk attends to two parts, merged by their log-sum-exp (`ascend_platform.pcp.attention`):
the KV cached before this step (its request's computed tokens, in the paged cache) and this step's keys of its
request up to the chunk's end, taken straight from the all-gathered K/V. This module computes, on the host and
once per step, which gathered rows those step keys are: the partition knows every rank's segments, so no
collective is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class PCPAttentionLayout:
    """The attention plan of one rank's prefill chunks for one step (absent when the rank has none)."""

    first_prefill_row: int  # local rows before it are decode rows: they read the KV replica only
    prefill_token_start: int  # the first query token of the first prefill row
    query_start_loc: torch.Tensor  # int32 [num_prefill_rows + 1], from 0: each chunk's queries
    context_lens: torch.Tensor  # int32 [num_prefill_rows]: tokens cached before this step (the paged part)
    kv_index: torch.Tensor  # int64 [sum of step keys]: gathered K/V rows of each chunk's step keys, in order
    kv_start_loc: torch.Tensor  # int32 [num_prefill_rows + 1]: each chunk's run in kv_index
    context_rows: int  # chunks continuing a context (chunked prefill, prefix-cache hit): the merge runs for them
    # query_start_loc / context_lens / kv_start_loc as host lists (the plan is made on the host once per step), so the
    # kernels of every layer launch without reading them back
    query_start_loc_host: tuple[int, ...]
    context_lens_host: tuple[int, ...]
    kv_start_loc_host: tuple[int, ...]

    @property
    def num_prefill_rows(self) -> int:
        return int(self.context_lens.shape[0])

    @property
    def has_context(self) -> bool:
        return self.context_rows > 0


def canonical_gather_index(segments_by_rank: Sequence[Sequence[Any]], padded_local_tokens: int,
                           num_global_tokens: int, keep: np.ndarray) -> np.ndarray:
    """For each global token, its row in the all-gathered (padded, rank after rank) K/V; -1 where no rank is its
    canonical writer. `keep[rank][i]` says whether segment i of `rank` is canonical (vLLM's rule: a replicated
    request is written by rank 0 only)."""
    index = np.full(num_global_tokens, -1, dtype=np.int64)
    for rank, segments in enumerate(segments_by_rank):
        base = rank * padded_local_tokens
        for i, seg in enumerate(segments):
            if not keep[rank][i]:
                continue
            local = seg.rank_local_batch_slice
            index[seg.global_batch_slice] = np.arange(base + local.start, base + local.stop, dtype=np.int64)
    return index


def build_layout(local_segments: Sequence[Any], gather_index: np.ndarray, *, query_start_loc_np: np.ndarray,
                 num_computed_tokens_np: np.ndarray, is_prefilling_np: np.ndarray,
                 device: torch.device) -> PCPAttentionLayout | None:
    """The layout of this rank's prefill chunks (`local_segments`, in local row order), or None when it has none.

    A chunk of request g covers global tokens [a, b) of the step; the request's step keys start at
    `query_start_loc_np[g]` with position `num_computed_tokens_np[g]`, so the chunk (ending at position
    `num_computed + b - qsl[g]`) sees the first `b - qsl[g]` of them.
    """
    prefill = [bool(is_prefilling_np[s.global_batch_req_idx]) for s in local_segments]
    first = next((i for i, p in enumerate(prefill) if p), None)
    if first is None:
        return None
    if not all(prefill[first:]):
        raise RuntimeError(f"PCP local rows are not decodes-first: prefill flags {prefill}")
    chunks = local_segments[first:]
    q_lens, ctx, kv_runs = [], [], []
    for seg in chunks:
        g = seg.global_batch_req_idx
        step_start = int(query_start_loc_np[g])
        keys = seg.global_batch_slice.stop - step_start
        run = gather_index[step_start:step_start + keys]
        if run.size and int(run.min()) < 0:
            raise RuntimeError(f"PCP request {g}: a step key of rows [{step_start}, {step_start + keys}) has no "
                               "canonical gathered row")
        q_lens.append(seg.num_tokens)
        ctx.append(int(num_computed_tokens_np[g]))
        kv_runs.append(run)
    qsl = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum(q_lens, out=qsl[1:])
    ksl = np.zeros(len(chunks) + 1, dtype=np.int32)
    np.cumsum([r.size for r in kv_runs], out=ksl[1:])
    return PCPAttentionLayout(
        first_prefill_row=first,
        prefill_token_start=int(chunks[0].rank_local_batch_slice.start),
        query_start_loc=torch.from_numpy(qsl).to(device),
        context_lens=torch.tensor(ctx, dtype=torch.int32).to(device),
        kv_index=torch.from_numpy(np.concatenate(kv_runs)).to(device),
        kv_start_loc=torch.from_numpy(ksl).to(device),
        context_rows=sum(c > 0 for c in ctx),
        query_start_loc_host=tuple(int(v) for v in qsl),
        context_lens_host=tuple(ctx),
        kv_start_loc_host=tuple(int(v) for v in ksl),
    )
