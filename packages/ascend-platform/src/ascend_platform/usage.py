"""Process-wide usage markers: which of our parts ran in this engine process.

The runner, the attention backend and the kernel calls bump counters here; tests read them back from the worker
with `collective_rpc("ascend_usage")` to prove our allocator, backend and kernel facade did the work, not vLLM's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_COUNTS: Counter[str] = Counter()
_SECONDS: Counter[str] = Counter()
_FACTS: dict[str, Any] = {}


def count(name: str, n: int = 1) -> None:
    _COUNTS[name] += n


def note(name: str, value: Any) -> None:
    _FACTS[name] = value


@contextmanager
def timed(name: str) -> Iterator[None]:
    """Count one call of `name` and add its wall time (for the start-up benchmark's breakdown). Inside a region
    torch.compile traces (vLLM's compiled model on a device) nothing is recorded: the traced graph replays no Python,
    and Dynamo cannot trace the clock (it stopped the compile there, found by the emulated NPU runtime)."""
    import torch

    if torch.compiler.is_compiling():
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        _SECONDS[name] += time.perf_counter() - t0
        _COUNTS[name] += 1


def snapshot() -> dict[str, Any]:
    return {"counts": dict(_COUNTS), "seconds": {k: round(v, 6) for k, v in _SECONDS.items()}, "facts": dict(_FACTS)}
