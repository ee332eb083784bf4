"""Connector stats in vLLM's `KVConnectorStats` shape: numeric counters that sum across workers and intervals."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

# Stats keys that are current levels, not counters: never exported as Prometheus counters.
GAUGE_KEYS = frozenset({"held_now", "pending_saves", "held_requests", "handoffs_waiting", "push_writes_queued",
                        "epoch"})
# Prometheus refuses a second metric of the same name in one registry: one counter per name per process.
_COUNTERS: dict[tuple[Any, str], Any] = {}


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


class AscendPromMetrics(KVConnectorPromMetrics):
    """Each counter of a connector's stats as a Prometheus counter `vllm:ascend_kv_<connector>_<key>`.

    vLLM's `MultiConnector` requires every child that reports stats to have Prometheus metrics (it asserts so when it
    observes them); a connector used alone gets them too. Counters are created when a key is first seen.
    """

    def __init__(self, vllm_config: Any, metric_types: dict, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]], connector_name: str):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._prefix = "vllm:ascend_kv_" + "".join(f"_{c.lower()}" if c.isupper() else c
                                                    for c in connector_name).lstrip("_")

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        data = getattr(transfer_stats_data, "data", transfer_stats_data)
        for key, value in data.items():
            if key in GAUGE_KEYS or isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                continue
            name = f"{self._prefix}_{key}"
            counter = _COUNTERS.get((self._counter_cls, name))
            if counter is None:
                counter = self._counter_cls(name=name, documentation=f"{key} (ascend-kv-transfer)",
                                            labelnames=self._labelnames)
                _COUNTERS[(self._counter_cls, name)] = counter
            counter.labels(*self.per_engine_labelvalues[engine_idx]).inc(value)
