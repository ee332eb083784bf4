"""Connector stats in vLLM's `KVConnectorStats` shape: numeric counters that sum across workers and intervals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats


@dataclass
class AscendKVConnectorStats(KVConnectorStats):
    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in other.data.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self.data[key] = self.data.get(key, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {k: v for k, v in self.data.items() if isinstance(v, int | float) and not isinstance(v, bool)}

    def is_empty(self) -> bool:
        return not any(self.reduce().values())


class CounterDeltas:
    """Turns monotonically growing counters into per-interval deltas for `get_kv_connector_stats`."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def take(self, counters: dict[str, Any]) -> AscendKVConnectorStats | None:
        delta = {}
        for key, value in counters.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                diff = value - self._last.get(key, 0)
                self._last[key] = value
                if diff:
                    delta[key] = diff
        return AscendKVConnectorStats(data=delta) if delta else None
