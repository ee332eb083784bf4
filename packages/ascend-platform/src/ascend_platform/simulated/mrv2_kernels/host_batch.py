"""The per-step batch stand-ins (`batch.py`, `sampling.gumbel_sample`'s bookkeeping and the simulated block tables'
gather) on host memory, taken when every tensor of a launch is a CPU tensor (the simulated lane on the CPU).

Each step launches six of these on a handful of requests, where the work is a few dozen integers and the cost is the
op count: the torch formulation is 10-25 eager ops a launch at ~3-5 us each (300 us a step over five of them in an
MRV2 engine of the tiny Llama, 4 decodes). `batch.py`'s four kernels run on `ascend_kernels`' native loops
(`native_mrv2_step`, one C call each: ~170 us a step as numpy over the four, ~50 us as C calls); a sampling launch
whose rows are all greedy on one native call too (`native_mrv2_greedy`: the stand-in ~110 -> ~25 us a step); the
block-table gather on one native call a KV cache group (as numpy it was ~2 % of that decode step); the gumbel
bookkeeping of launches that sample on numpy views (~0.5-1 us an op; `numpy()` views share the tensors' memory, so
writes land in them). The torch formulation stays for every other device (the emulated NPU's tensors) and for a host
without the native library, and is held to vLLM's kernels as these are (`tests/simulated/kernel_parity_driver.py` runs
both).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from ascend_kernels.reference import native_mrv2_greedy, native_mrv2_step
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
    if not _ENABLED[-1]:
        return False
    for t in tensors:
        if t is not None and not t.is_cpu:
            return False
    usage.count(f"mrv2_kernels.host.{stand_in}")
    return True


def _v(t: torch.Tensor) -> np.ndarray:
    """A dense tensor as the kernel addresses its pointer: a flat numpy view of its elements (`common.flat`'s)."""
    return flat(t).numpy()


def _taken(stand_in: str, done: bool) -> bool:
    if done:
        usage.count(f"mrv2_kernels.host.{stand_in}")
    return done


# The four per-step batch kernels on `ascend_kernels`' native loops (`native_mrv2_step`): each returns True when the
# loop did the launch's work, False (nothing written) when the host path is off or the loop does not take the call.
def prepare_pos_seq_lens(*args) -> bool:
    return _ENABLED[-1] and _taken("prepare_pos_seq_lens", native_mrv2_step.prepare_pos_seq_lens(*args))


def combine_sampled_and_draft_tokens(*args) -> bool:
    return _ENABLED[-1] and _taken("combine_sampled_and_draft_tokens",
                                   native_mrv2_step.combine_sampled_and_draft_tokens(*args))


def get_num_sampled_and_rejected(*args) -> bool:
    return _ENABLED[-1] and _taken("get_num_sampled_and_rejected",
                                   native_mrv2_step.get_num_sampled_and_rejected(*args))


def post_update(*args) -> bool:
    return _ENABLED[-1] and _taken("post_update", native_mrv2_step.post_update(*args))


def gumbel_greedy(logits, expanded_idx_mapping_ptr, temp_ptr, local_argmax_ptr, local_max_ptr) -> bool:
    """A launch whose every row is greedy (temperature 0 or padding): each row's argmax into the launcher's block
    column 0 on `ascend_kernels`' native loop; False (nothing written) when a row samples or the loop is off."""
    return _ENABLED[-1] and _taken("gumbel_greedy", native_mrv2_greedy.gumbel_greedy(
        logits, expanded_idx_mapping_ptr, temp_ptr, local_argmax_ptr, local_max_ptr))


def gumbel_rows(expanded_idx_mapping_ptr, temp_ptr, seeds_ptr, pos_ptr,
                drafting_salt: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each logits row's temperature, seed and noise position (rows of no request: temperature 0, seed 0), as the
    tensors `ascend_kernels`' `gumbel_sample` takes."""
    reqs = _v(expanded_idx_mapping_ptr)
    temps, row_seeds = _v(temp_ptr), _v(seeds_ptr)
    if reqs.shape[0] == 0 or reqs.min() >= 0:  # every row a request's (the rows of a step without padding)
        temperature, seeds = temps[reqs].astype(np.float32, copy=False), row_seeds[reqs].astype(np.int64, copy=False)
    else:
        valid = reqs >= 0
        safe = np.where(valid, reqs, 0)
        temperature = np.where(valid, temps[safe].astype(np.float32), np.float32(0.0))
        seeds = np.where(valid, row_seeds[safe].astype(np.int64), 0)
    positions = _v(pos_ptr).astype(np.int64) + drafting_salt
    return torch.from_numpy(temperature), torch.from_numpy(seeds), torch.from_numpy(positions)


def temperature_rows(logits: torch.Tensor, expanded_idx_mapping_ptr, temperature_ptr) -> bool:
    """float32 `logits` rows divided in place by their request's temperature (0 and 1 leave a row alone), as numpy
    float32 divisions (torch's, bit for bit); False (nothing written) for other logits dtypes or devices."""
    if logits.dtype != torch.float32 or temperature_ptr.dtype != torch.float32:
        return False
    if not on_host("temperature", logits, expanded_idx_mapping_ptr, temperature_ptr):
        return False
    temp = _v(temperature_ptr)[_v(expanded_idx_mapping_ptr)]
    rows = np.nonzero((temp != 0.0) & (temp != 1.0))[0]
    if rows.shape[0]:
        view = logits.numpy()
        with np.errstate(all="ignore"):  # inf / NaN as torch gives them, without numpy's warnings in the engine log
            view[rows] = view[rows] / temp[rows, None]
    return True


def write_gumbel_winners(local_argmax_ptr, local_max_ptr, sampled: torch.Tensor) -> None:
    """The whole row's winner into block column 0 (the launcher's per-block reduction then picks it)."""
    local_argmax_ptr.numpy()[:, 0] = sampled.numpy()
    best = local_max_ptr.numpy()
    best[:, 0] = 0.0
    best[:, 1:] = -np.inf


def gather_block_tables(sources, num_blocks, idx_mapping, destinations, num_reqs_padded: int) -> bool:
    """Each KV cache group's block table rows of the batch's requests into its input table on `ascend_kernels`'
    native loop (`native_mrv2_step.gather_block_table`, one call a group), entries past a request's block count left
    as they were, rows up to num_reqs_padded zeroed; False when the host path is off or the loop does not take a
    group. The gather is idempotent, so the caller's torch formulation may then redo the groups already done."""
    if not _ENABLED[-1]:
        return False
    for group, (src, dst) in enumerate(zip(sources, destinations, strict=True)):
        if not native_mrv2_step.gather_block_table(src, num_blocks[group], idx_mapping, dst, num_reqs_padded):
            return False
    return _taken("gather_block_tables", True)
