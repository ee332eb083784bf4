"""What ran between two snapshots of a counter table (a worker's usage counts, the bindings' torch_npu ops and
fallbacks, the fake torch_npu's calls): each counter that moved, by how much."""

from __future__ import annotations

from collections.abc import Mapping


def counter_delta(now: Mapping[str, float], then: Mapping[str, float]) -> dict[str, float]:
    return {k: v - then.get(k, 0) for k, v in now.items() if v != then.get(k, 0)}
