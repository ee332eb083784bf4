"""Adapters for the KV connector API's newer parts, absent on the legacy lane.

From 0.29 on a connector reports finished and failed transfers in one `KVConnectorTransferResults`
(`get_transfer_results`) and labels its cache hits with a `CacheHitSource`; the legacy lane's engine only calls
`get_finished` and `get_block_ids_with_load_errors`, and has neither type. Connectors import these through the
adapters so their modules load on either lane; the legacy engine never calls the methods that need them.
The planned KV layout is read through `kv_config_layout`; connectors that need the scheduler's KV cache manager
(`bind_kv_cache_manager`) are refused where vLLM never binds it (`connector_kv_manager_unavailable_reason`).
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


def kv_config_layout(kv_cache_config: Any) -> str | None:
    """The KV layout a `KVCacheConfig` was planned with (`kv_cache_layout`, 0.29+), or None on the legacy lane, which
    plans none (each attention backend shapes its own pages)."""
    layout = getattr(kv_cache_config, "kv_cache_layout", None)
    return None if layout is None else str(layout)


def connector_kv_manager_unavailable_reason() -> str | None:
    """Why a connector that reads block ids from the scheduler's KV cache manager (`bind_kv_cache_manager`, 0.29+)
    cannot run on the installed vLLM, or None. The legacy engine never hands a connector that manager."""
    from ascend_core.upstream.version import installed_vllm_version

    base = importlib.import_module(BASE_MODULE).KVConnectorBase_V1
    if hasattr(base, "bind_kv_cache_manager"):
        return None
    return (f"vLLM {installed_vllm_version()}: KVConnectorBase_V1 has no bind_kv_cache_manager, so the scheduler never "
            "hands a connector the KV cache manager it reads block ids from")
