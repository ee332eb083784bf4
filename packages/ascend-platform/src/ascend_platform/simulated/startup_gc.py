"""The simulated lane's worker heap, frozen for the cyclic garbage collector before the model loads.

By the time a worker starts, the process holds ~700k long-lived objects (torch, vLLM, transformers, the Triton
interpreter's decorated kernels); a full `gc.collect()` walks all of them, ~0.4 s of CPU each on the tiny model's
engine. vLLM then runs full collections during start-up: two around weight loading (both runners), three more in
Model Runner V2's `DeviceMemoryProfiler` (around `load_model`: on the CPU device it reads host-wide memory, which a
Python collection does not change), and three at the end (`freeze_gc_heap`, which then freezes the whole heap).
Those three profiler collections were most of what MRV2 start-up cost over V1 here (issue 38).

`freeze_startup_heap()` does once, at worker start, what vLLM's `freeze_gc_heap` does at the end: collect, then
`gc.freeze()` what survived, so the later collections walk only what the start-up itself creates. Nothing that was
garbage at that point is kept (it is collected first); objects created later are collected as before. What an engine
computes is unchanged. The real-device platform does not do this.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collect, then freeze the surviving heap for the cyclic collector; returns the number of frozen objects."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
