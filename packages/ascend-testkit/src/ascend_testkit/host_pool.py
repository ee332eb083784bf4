"""The KV pool across the hosts of a `Topology` (`ascend_testkit.hosts`): `mooncake_master` on a host of its own,
bound to that host's address, and `ascend-vllm serve` engines on other hosts whose `AscendStoreConnector` reaches
it there and advertises its own host's address to the other clients of the pool (where they read its segment).
"""

from __future__ import annotations

import os

from ascend_testkit.hosts import Host
from ascend_testkit.mooncake_master import MooncakeMaster

# Below Linux's ephemeral range (32768-60999), where the engines on the master's host would take theirs.
MASTER_RPC_PORT = 27051


def start_master_on(host: Host, log_path: str | os.PathLike, *, rpc_port: int = MASTER_RPC_PORT,
                    **flags) -> MooncakeMaster:
    """`mooncake_master --rpc_address=<host's address>` on `host`, listening once this returns."""
    return MooncakeMaster(host, log_path, rpc_port=rpc_port, rpc_address=host.address, flags=flags or None)


def host_pool_config(host: Host, master: MooncakeMaster, *, segment: str = "64MiB", **extra) -> dict:
    """An `AscendStoreConnector` config (`kv_both`, recompute on a failed load) for an engine on `host`: the master's
    address on its own host, this host's address as the store client's `local_hostname`."""
    return {"kv_connector": "AscendStoreConnector", "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"master_server_address": master.address, "local_hostname": host.address,
                                          "global_segment_size": segment, **extra}}


def connector_counter(metrics_text: str, connector: str, key: str) -> float:
    """A connector stats counter from a server's /metrics text (`vllm:ascend_kv_<connector>_<key>_total`, summed
    over its label sets; 0 before the connector first reported it)."""
    name = f"vllm:ascend_kv_{connector}_{key}"
    total = 0.0
    for line in metrics_text.splitlines():
        if line.startswith((name + "_total{", name + "_total ", name + "{", name + " ")):
            total += float(line.rsplit(" ", 1)[1])
    return total


__all__ = ["MASTER_RPC_PORT", "connector_counter", "host_pool_config", "start_master_on"]
