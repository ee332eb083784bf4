"""Model Runner V2's greedy sampling rows on a native loop (`native/mrv2_greedy.c`), for the simulated lane's stand-in
of vLLM's `_gumbel_sample_kernel` (`ascend_platform.simulated.mrv2_kernels.sampling.gumbel_sample`).

`gumbel_greedy` takes a launch whose every row is greedy (its request's temperature is 0, or a padding row) and writes
each row's winner, the argmax of its float32 logits as torch's argmax picks it, into block column 0 of the launcher's
per-block outputs (`local_argmax`, `local_max`; the other columns -inf). It returns False, nothing written, when it
does not take the launch: a row samples (the facade's Gumbel sampler does those), no library, a tensor off the host,
an unexpected dtype or layout, or a trace under torch.compile. A request index past the temperatures raises
IndexError naming the batch row; nothing is written then.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build
from ascend_kernels.reference.native_layers import DTYPE_CODES

_INDEX = (torch.int32, torch.int64)
_MAX = (torch.float32, torch.float64)
MAX_VOCAB = 2**31 - 64  # argmax.h's lanes count token ids in int32 (the Gumbel loop's too)


def _host(t: torch.Tensor) -> bool:
    return type(t) is torch.Tensor and t.is_cpu


def gumbel_greedy(logits: torch.Tensor, expanded_idx_mapping: torch.Tensor, temperature: torch.Tensor,
                  local_argmax: torch.Tensor, local_max: torch.Tensor) -> bool:
    """Greedy winners of `logits` `[rows, vocab]` (rows of stride `logits.stride(0)`, dense within a row) into
    `local_argmax` int64 / `local_max` float32|64 `[rows, num_blocks]`; see the module's docstring."""
    lib = native_build.library()
    if lib is None or torch.compiler.is_compiling():
        return False
    rows, vocab = logits.shape
    if vocab > MAX_VOCAB:
        return False
    if not (_host(logits) and _host(expanded_idx_mapping) and _host(temperature) and _host(local_argmax)
            and _host(local_max)):
        return False
    if (logits.dtype not in DTYPE_CODES or logits.stride(1) != 1 or expanded_idx_mapping.dtype not in _INDEX
            or not expanded_idx_mapping.is_contiguous() or expanded_idx_mapping.numel() < rows
            or temperature.dtype != torch.float32 or not temperature.is_contiguous()
            or local_argmax.dtype != torch.int64 or local_max.dtype not in _MAX
            or local_argmax.dim() != 2 or local_max.shape != local_argmax.shape or local_argmax.shape[0] < rows
            or local_argmax.shape[1] < 1 or local_argmax.stride(1) != 1 or local_max.stride(1) != 1):
        return False
    rc = lib.ak_mrv2_gumbel_greedy(logits.data_ptr(), DTYPE_CODES[logits.dtype], logits.stride(0), rows, vocab,
                                   expanded_idx_mapping.data_ptr(), int(expanded_idx_mapping.dtype == torch.int64),
                                   temperature.data_ptr(), temperature.numel(), local_argmax.data_ptr(),
                                   local_argmax.stride(0), local_max.data_ptr(), int(local_max.dtype == torch.float64),
                                   local_max.stride(0), local_max.shape[1])
    if rc == -1:
        return False
    if rc == -2:
        raise MemoryError(f"gumbel_sample: no host memory to convert {rows} rows of {vocab} {logits.dtype} logits")
    if rc > 0:
        raise IndexError(f"gumbel_sample: batch row {rc - 1}'s request reaches past the {temperature.numel()} "
                         "request temperatures")
    native_build.record("gumbel_greedy")
    return True
