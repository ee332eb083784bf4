"""Process-wide usage markers: which of our parts ran in this engine process.

The runner, the attention backend and a few engine hooks bump counters here, and every kernel facade op call counts
and times itself as "kernels.<op>" (`kernel_op_timer`, installed on the kernel registry: no caller counts its own
op calls); tests read them back from the worker with `collective_rpc("ascend_usage")` to prove our allocator,
backend and kernel facade did the work, not vLLM's.
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
_ON_DEVICE: dict[str, Any] = {}  # name -> a running total still on the device (`count_on_device`)


def count(name: str, n: int = 1) -> None:
    _COUNTS[name] += n


def count_on_device(name: str, flags: Any) -> None:
    """Add the number of true (or the sum of) `flags`, a tensor, without reading it back: the total stays on the
    device until `snapshot` (a read-back per layer would stall the step on a device). Not inside a region
    torch.compile traces."""
    import torch

    if torch.compiler.is_compiling():
        return
    n = flags.sum()
    total = _ON_DEVICE.get(name)
    _ON_DEVICE[name] = n if total is None else total + n


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


def kernel_op_timer(op: str):
    """The kernel registry's op observer (`ascend_kernels.registry.set_op_observer`, installed by
    `facade.kernel_ops`): every call of facade op `op` counts and times "kernels.<op>", whoever makes it. Not inside
    a region torch.compile traces (as `timed`)."""
    import torch

    key = f"kernels.{op}"

    def wrap(fn):
        def timed_op(*args, **kwargs):
            if torch.compiler.is_compiling():  # called as such: Dynamo folds this very call
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                _SECONDS[key] += time.perf_counter() - t0
                _COUNTS[key] += 1

        timed_op.__name__ = timed_op.__qualname__ = getattr(fn, "__name__", op)
        timed_op.__wrapped__ = fn
        return timed_op

    return wrap


def snapshot() -> dict[str, Any]:
    counts = Counter(_COUNTS)
    for name, total in _ON_DEVICE.items():
        counts[name] += int(total)
    return {"counts": dict(counts), "seconds": {k: round(v, 6) for k, v in _SECONDS.items()}, "facts": dict(_FACTS)}
