"""Gumbel-max sampling (`reference.gumbel.gumbel_sample`, float32 noise) on a native loop (`native/gumbel.c`).

`gumbel_sample` returns the winners `[rows]` int64, or None when it does not take the call and the torch formulation
runs: no library, a tensor off the host, float64 noise (`fp64`), an unexpected dtype or layout, a temperature, seed
or position that is not one entry a row, or a trace under torch.compile. Each row's seed and position are mixed here
(`reference.gumbel._row_state`, Python ints for a few rows), each token's noise in the loop; see the C file for what
may differ from torch in the last bit.
"""

from __future__ import annotations

import torch

from ascend_kernels.reference import native_build
from ascend_kernels.reference.native_layers import DTYPE_CODES
from ascend_kernels.reference.native_mrv2_greedy import MAX_VOCAB


def gumbel_sample(logits: torch.Tensor, temperature: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor,
                  row_state, apply_temperature: bool) -> torch.Tensor | None:
    """Winners of `logits` `[rows, vocab]` (dense rows): argmax where `temperature` is 0, else argmax of the
    (tempered) logits plus each row's counter-based Gumbel noise; `row_state(seeds, positions)` mixes the rows'
    seeds and positions (`[rows, 1]` int64)."""
    lib = native_build.library()
    if lib is None or torch.compiler.is_compiling():
        return None
    rows, vocab = logits.shape
    if vocab == 0 or vocab > MAX_VOCAB or logits.dtype not in DTYPE_CODES or logits.stride(1) != 1:
        return None
    if not all(type(t) is torch.Tensor and t.is_cpu for t in (logits, temperature, seeds, positions)):
        return None
    if any(t.dim() != 1 or t.shape[0] != rows for t in (temperature, seeds, positions)):
        return None  # one entry a row: the loop reads temperature[r] and row r's state
    temp = temperature.float().contiguous()
    state = row_state(seeds, positions).view(-1).to(torch.int32)  # the 32-bit states, as int32 bits
    winners = torch.empty(rows, dtype=torch.int64)
    rc = lib.ak_gumbel_sample(logits.data_ptr(), DTYPE_CODES[logits.dtype], logits.stride(0), rows, vocab,
                              temp.data_ptr(), state.data_ptr(), int(bool(apply_temperature)), winners.data_ptr(),
                              torch.get_num_threads())
    if rc == -2:
        raise MemoryError(f"gumbel_sample: no host memory for a {vocab}-token scratch row")
    native_build.record("gumbel_sample")
    return winners
