"""The per-step batch stand-ins (`batch.py`, `sampling.gumbel_sample`'s bookkeeping and the simulated block tables'
gather) on host memory through numpy views, taken when every tensor of a launch is a CPU tensor (the simulated lane
on the CPU).

Each step launches six of these on a handful of requests, where the work is a few dozen integers and the cost is
the op count: the torch formulation is 10-25 eager ops a launch at ~3-5 us each (measured in an MRV2 engine of the
tiny Llama, 4 decodes: 300 us a step over five of them, about a fifth of the step), numpy's are ~0.5-1 us. The torch
formulation stays for every other device (the emulated NPU's tensors) and is held to vLLM's kernels as these are
(`tests/simulated/kernel_parity_driver.py` runs both). `numpy()` views share the tensors' memory: writes land in them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from ascend_platform import usage
from ascend_platform.simulated.mrv2_kernels.common import flat

_ENABLED = [True]


@contextlib.contextmanager
def disabled() -> Iterator[None]:
    """The torch formulation for every launch inside (the parity driver holds it to vLLM's kernels too)."""
    _ENABLED.append(False)
    try:
        yield
    finally:
        _ENABLED.pop()


def on_host(stand_in: str, *tensors: torch.Tensor | None) -> bool:
    """Whether a launch takes its host path (counted per stand-in in the usage report: `mrv2_kernels.host.<name>`)."""
    if not (_ENABLED[-1] and all(t is None or t.device.type == "cpu" for t in tensors)):
        return False
    usage.count(f"mrv2_kernels.host.{stand_in}")
    return True


def _v(t: torch.Tensor) -> np.ndarray:
    """A dense tensor as the kernel addresses its pointer: a flat numpy view of its elements (`common.flat`'s)."""
    return flat(t).numpy()


def _segments(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each element's segment index and its offset inside the segment, for segments of these lengths."""
    seg = np.repeat(np.arange(counts.shape[0]), counts)
    return seg, np.arange(seg.shape[0]) - (np.cumsum(counts) - counts)[seg]


def prepare_pos_seq_lens(pos_ptr, seq_lens_ptr, idx_mapping_ptr, query_start_loc_ptr, num_computed_tokens_ptr,
                         max_num_reqs) -> None:
    nr = idx_mapping_ptr.shape[0]
    qsl = _v(query_start_loc_ptr)[: nr + 1].astype(np.int64)
    lens = qsl[1:] - qsl[:-1]
    computed = _v(num_computed_tokens_ptr)[_v(idx_mapping_ptr)].astype(np.int64)
    seq_lens = _v(seq_lens_ptr)
    seq_lens[:nr] = computed + lens
    seq_lens[nr:max_num_reqs] = 0
    n = int(qsl[nr]) if nr else 0
    if n == nr:  # one token per request (decode): its position is its computed length
        _v(pos_ptr)[:n] = computed
    elif n:
        seg, offset = _segments(lens)
        _v(pos_ptr)[:n] = computed[seg] + offset


def combine_sampled_and_draft_tokens(input_ids_ptr, idx_mapping_ptr, last_sampled_tokens_ptr, query_start_loc_ptr,
                                     seq_lens_ptr, prefill_len_ptr, draft_tokens_ptr, draft_tokens_stride,
                                     cu_num_logits_ptr, logits_indices_ptr, new_sampled: int) -> None:
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    reqs = _v(idx_mapping_ptr).astype(np.int64)
    cu = _v(cu_num_logits_ptr)[: nr + 1].astype(np.int64)
    num_logits = cu[1:] - cu[:-1]
    query_end = _v(query_start_loc_ptr)[1 : nr + 1].astype(np.int64)
    logits_start = query_end - num_logits
    indices = _v(logits_indices_ptr)
    if indices.shape[0] == nr:  # one logit per request: its last query token
        indices[:] = logits_start
    else:
        seg, offset = _segments(num_logits)
        indices[:] = logits_start[seg] + offset
    seq_len = _v(seq_lens_ptr)[:nr].astype(np.int64)
    prefill_len = _v(prefill_len_ptr)[reqs].astype(np.int64)
    decoding = seq_len > prefill_len
    input_ids = _v(input_ids_ptr)
    if new_sampled > 0:
        rows = np.nonzero(decoding & (seq_len - num_logits >= prefill_len))[0]
        if rows.shape[0]:
            input_ids[logits_start[rows]] = _v(last_sampled_tokens_ptr)[reqs[rows]]
    num_drafts = num_logits - new_sampled
    drafts = _v(draft_tokens_ptr) if draft_tokens_ptr is not None else None
    for r in np.nonzero(decoding & (num_drafts > 0))[0].tolist():  # spec decode only
        k, end, start = int(num_drafts[r]), int(query_end[r]), int(reqs[r]) * draft_tokens_stride
        input_ids[end - k : end] = drafts[start : start + k]


def get_num_sampled_and_rejected(num_sampled_ptr, num_rejected_ptr, seq_lens_ptr, cu_num_logits_ptr,
                                 idx_mapping_ptr, prefill_len_ptr) -> None:
    nr = idx_mapping_ptr.shape[0]
    chunked = _v(seq_lens_ptr)[:nr] < _v(prefill_len_ptr)[_v(idx_mapping_ptr)]
    sampled = _v(num_sampled_ptr)
    sampled[:nr] = np.where(chunked, 0, sampled[:nr])
    cu = _v(cu_num_logits_ptr)[: nr + 1].astype(np.int64)
    _v(num_rejected_ptr)[:nr] = np.where(chunked, 0, cu[1:] - cu[:-1] - sampled[:nr])


def post_update(idx_mapping_ptr, num_computed_tokens_ptr, last_sampled_tokens_ptr, output_bin_counts_ptr,
                output_bin_counts_stride, sampled_tokens_ptr, num_sampled_ptr, num_rejected_ptr,
                query_start_loc_ptr, all_token_ids_ptr, all_token_ids_stride, total_len_ptr) -> None:
    nr = idx_mapping_ptr.shape[0]
    if nr == 0:
        return
    reqs = _v(idx_mapping_ptr).astype(np.int64)
    num_sampled = _v(num_sampled_ptr)[:nr].astype(np.int64)
    sampled = sampled_tokens_ptr.numpy().reshape(sampled_tokens_ptr.shape[0], -1)[:nr]
    num_rejected = _v(num_rejected_ptr)[:nr].astype(np.int64)
    if query_start_loc_ptr is None:
        query_len = np.zeros_like(num_sampled)
    else:
        qsl = _v(query_start_loc_ptr)[: nr + 1].astype(np.int64)
        query_len = qsl[1:] - qsl[:-1]
    keep = reqs >= 0
    if not keep.all():
        reqs, num_sampled, sampled = reqs[keep], num_sampled[keep], sampled[keep]
        num_rejected, query_len = num_rejected[keep], query_len[keep]
    total_len = _v(total_len_ptr)
    start = total_len[reqs].astype(np.int64)
    has = np.nonzero(num_sampled > 0)[0]
    if has.shape[0]:
        rows, counts = reqs[has], num_sampled[has]
        _v(last_sampled_tokens_ptr)[rows] = sampled[has, counts - 1]
        if sampled.shape[1] == 1:  # no drafts: one token per row
            owner, tokens, slot = rows, sampled[has, 0], start[has]
        else:
            seg, offset = _segments(counts)
            owner, tokens, slot = rows[seg], sampled[has[seg], offset], start[has][seg] + offset
        tokens = tokens.astype(np.int64)
        _v(all_token_ids_ptr)[owner * all_token_ids_stride + slot] = tokens
        if output_bin_counts_ptr is not None:
            np.add.at(_v(output_bin_counts_ptr), owner * output_bin_counts_stride + tokens, 1)
        total_len[rows] = start[has] + counts
    np.add.at(_v(num_computed_tokens_ptr), reqs, query_len - num_rejected)


def gumbel_rows(expanded_idx_mapping_ptr, temp_ptr, seeds_ptr, pos_ptr,
                drafting_salt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each logits row's temperature, seed and noise position (rows of no request: temperature 0, seed 0), as the
    tensors `ascend_kernels`' `gumbel_sample` takes."""
    reqs = _v(expanded_idx_mapping_ptr).astype(np.int64)
    valid = reqs >= 0
    safe = np.where(valid, reqs, 0)
    temperature = np.where(valid, _v(temp_ptr)[safe].astype(np.float32), np.float32(0.0))
    seeds = np.where(valid, _v(seeds_ptr)[safe].astype(np.int64), 0)
    positions = _v(pos_ptr).astype(np.int64) + drafting_salt
    return torch.from_numpy(temperature), torch.from_numpy(seeds), torch.from_numpy(positions)


def write_gumbel_winners(local_argmax_ptr, local_max_ptr, sampled: torch.Tensor) -> None:
    """The whole row's winner into block column 0 (the launcher's per-block reduction then picks it)."""
    local_argmax_ptr.numpy()[:, 0] = sampled.numpy()
    best = local_max_ptr.numpy()
    best[:, 0] = 0.0
    best[:, 1:] = -np.inf


def gather_block_tables(sources, num_blocks, idx_mapping, destinations, num_reqs_padded: int) -> None:
    """Each KV cache group's block table rows of the batch's requests into its input table, entries past a
    request's block count left as they were, rows up to num_reqs_padded zeroed."""
    reqs = idx_mapping.numpy().astype(np.int64)
    counts = num_blocks.numpy()
    for group, (src, dst) in enumerate(zip(sources, destinations, strict=True)):
        out = dst.numpy()
        if reqs.shape[0]:
            rows = src.numpy()[reqs]
            filled = np.arange(rows.shape[1]) < counts[group, reqs][:, None]
            out[: reqs.shape[0]] = np.where(filled, rows, out[: reqs.shape[0]])
        out[reqs.shape[0] : num_reqs_padded] = 0
