"""Connector stats as Prometheus counters (vLLM's MultiConnector asserts every child that reports stats has them)."""

import functools

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ascend_kv_transfer.stats import AscendKVConnectorStats
from ascend_kv_transfer.store_connector import AscendStoreConnector


def test_counters_are_exported_per_engine():
    registry = CollectorRegistry()
    types = {Counter: functools.partial(Counter, registry=registry), Gauge: Gauge, Histogram: Histogram}
    config = type("Config", (), {"kv_transfer_config": None})()
    prom = AscendStoreConnector.build_prom_metrics(config, types, ["engine"], {0: ["0"]})
    prom.observe(AscendKVConnectorStats(data={"blocks_loaded": 5, "pending_saves": 2, "pool_enabled": True}))
    prom.observe({"blocks_loaded": 3, "held_requests": -1})
    name = "vllm:ascend_kv_ascend_store_connector_blocks_loaded_total"
    assert registry.get_sample_value(name, {"engine": "0"}) == 8
    assert registry.get_sample_value("vllm:ascend_kv_ascend_store_connector_pending_saves_total", {"engine": "0"}) \
        is None
