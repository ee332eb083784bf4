"""Adapters for the KV connector hooks whose presence differs between vLLM releases.

vLLM 0.33 added `KVConnectorBase_V1.unregister_kv_caches` (sleep mode: drop the registrations of KV memory that is
about to be freed); `capabilities().connector_unregister_kv_caches` says whether the installed release has it.
"""

from __future__ import annotations

from typing import Any

from ascend_core.upstream.lane import capabilities


def unregister_connector_kv_caches(connector: Any) -> bool:
    """Tell `connector` its registered KV memory is about to be freed; True when it had a hook to hear it.

    With the upstream hook every connector has the method (the base class's default does nothing). On an older
    release only a connector that defines it itself (ours do) can drop its registrations; any other one has no
    registrations it could drop, so there is nothing to call.
    """
    if not capabilities().connector_unregister_kv_caches and not hasattr(type(connector), "unregister_kv_caches"):
        return False
    connector.unregister_kv_caches()
    return True
