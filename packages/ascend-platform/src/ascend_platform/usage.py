"""Process-wide usage markers: which of our parts ran in this engine process.

The runner, the attention backend and the kernel calls bump counters here; tests read them back from the worker
with `collective_rpc("ascend_usage")` to prove our allocator, backend and kernel facade did the work, not vLLM's.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

_COUNTS: Counter[str] = Counter()
_FACTS: dict[str, Any] = {}


def count(name: str, n: int = 1) -> None:
    _COUNTS[name] += n


def note(name: str, value: Any) -> None:
    _FACTS[name] = value


def snapshot() -> dict[str, Any]:
    return {"counts": dict(_COUNTS), "facts": dict(_FACTS)}
