"""The `vllm.general_plugins` entry point: registers our KV connectors with vLLM's factory, once per process.

vLLM calls general plugins in every process (API server, engine core, workers), so this is idempotent.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)

# name as vLLM sees it -> (module, class); the modules are imported only when vLLM creates the connector.
CONNECTORS: dict[str, tuple[str, str]] = {
    "AscendMooncakeConnector": ("ascend_kv_transfer.mooncake_connector", "AscendMooncakeConnector"),
    "AscendMooncakeLayerwiseConnector": ("ascend_kv_transfer.mooncake_layerwise_connector",
                                         "AscendMooncakeLayerwiseConnector"),
    "AscendOffloadingConnector": ("ascend_kv_transfer.offloading_connector", "AscendOffloadingConnector"),
    "AscendStoreConnector": ("ascend_kv_transfer.store_connector", "AscendStoreConnector"),
}

_registered: set[str] = set()


def register() -> list[str]:
    """Register every connector not yet known to vLLM's `KVConnectorFactory`; returns the names registered now."""
    if not CONNECTORS:
        return []
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    done = []
    for name, (module, cls) in CONNECTORS.items():
        if name in _registered or name in KVConnectorFactory._registry:
            _registered.add(name)
            continue
        KVConnectorFactory.register_connector(name, module, cls)
        _registered.add(name)
        done.append(name)
    if done:
        logger.debug("registered KV connectors: %s", ", ".join(done))
    return done
