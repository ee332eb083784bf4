"""MRV2's sampler copies its per-request tables to the device only on steps that staged something.

vLLM's MRV2 runner calls `sampler.apply_staged_writes()` at every step (`add_requests`), and each call copies every
sampling table (temperature, top-p / top-k / min-p, seeds, penalties, logit-bias and stop-token counts, ... about 15
tables of `max_num_reqs` rows) to the device whether or not a request came in. The sampler's contract, and its
logits processors' ("flush any host-side writes staged by add_request()"), is that only `add_request` stages writes,
so a step that added no request has nothing to flush. On an NPU the tables are explicit-copy buffers (no UVA view of
host memory, `npu_mrv2_buffers`): ~15 host-to-device copies a decode step, for nothing; in the simulated lane the
same copies cost ~150 us of a ~2.5 ms tiny-model decode step.

Skipping a flush keeps each table's device copy as it was, which is what the host side still holds: the copies'
round-robin (vLLM rotates buffers so an in-flight step never reads a table being rewritten) is only needed when a
table changes.
"""

from __future__ import annotations

from typing import Any

from ascend_platform import usage


def flush_only_after_add(sampler: Any) -> None:
    """Make `sampler.apply_staged_writes` a no-op unless `sampler.add_request` ran since its last flush."""
    add_request, apply_staged_writes = sampler.add_request, sampler.apply_staged_writes
    staged = [True]  # the first flush runs whatever construction left behind

    def add_request_staging(req_idx: int, sampling_params: Any) -> Any:
        staged[0] = True
        return add_request(req_idx, sampling_params)

    def apply_staged_writes_if_any() -> None:
        if not staged[0]:
            usage.count("mrv2.sampler_flush_skipped")
            return
        apply_staged_writes()
        staged[0] = False  # after the copies: a flush that raised is tried again next step

    sampler.add_request = add_request_staging
    sampler.apply_staged_writes = apply_staged_writes_if_any
