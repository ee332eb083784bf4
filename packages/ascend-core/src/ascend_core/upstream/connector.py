"""Adapters for the KV connector API's newer result types, absent on the legacy lane.

From 0.29 on a connector reports finished and failed transfers in one `KVConnectorTransferResults`
(`get_transfer_results`) and labels its cache hits with a `CacheHitSource`; the legacy lane's engine only calls
`get_finished` and `get_block_ids_with_load_errors`, and has neither type. Connectors import these through the
adapters so their modules load on either lane; the legacy engine never calls the methods that need them.
"""

from __future__ import annotations

import importlib
from typing import Any

BASE_MODULE = "vllm.distributed.kv_transfer.kv_connector.v1.base"
CACHE_HIT_MODULE = "vllm.v1.metrics.cache_hit_source"


def cache_hit_source(name: str) -> Any:
    """`CacheHitSource.<name>` of the installed vLLM, or None where it has no cache-hit sources (legacy lane)."""
    from ascend_core.upstream.probes import module_exists

    if not module_exists(CACHE_HIT_MODULE):
        return None
    return getattr(importlib.import_module(CACHE_HIT_MODULE).CacheHitSource, name)


def transfer_results(**fields: Any) -> Any:
    """A `KVConnectorTransferResults(**fields)`; only a vLLM that has the type calls `get_transfer_results`."""
    cls = getattr(importlib.import_module(BASE_MODULE), "KVConnectorTransferResults", None)
    if cls is None:
        raise RuntimeError(f"{BASE_MODULE}.KVConnectorTransferResults is absent in the installed vLLM: its engine "
                           "collects transfers with get_finished() and get_block_ids_with_load_errors() instead")
    return cls(**fields)
