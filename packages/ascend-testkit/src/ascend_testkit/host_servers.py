"""`ascend-vllm serve` and `ascend-vllm router` started on one host of a `Topology` (`ascend_testkit.hosts`), bound
to that host's own address, as a user starts them on each machine of a multi-host deployment.

The processes are `ascend_testkit.servers`' own `start_serve` / `start_router` servers; only the bind address, the
namespace and the connector's `side_channel_host` differ from the one-namespace servers.
"""

from __future__ import annotations

import os

from ascend_testkit.hosts import Host
from ascend_testkit.servers import ServerProcess, p2p_kv_config, start_router, start_serve


def host_kv_config(host: Host, role: str, side_channel_port: int, engine_id: str, **extra) -> dict:
    """An `AscendMooncakeConnector` config whose side channel (and Mooncake's local name) is `host`'s address: what
    the prefill advertises to decode engines on other hosts."""
    return p2p_kv_config(role, side_channel_port, engine_id, side_channel_host=host.address, **extra)


def start_serve_on(
    host: Host,
    name: str,
    model: str | os.PathLike,
    port: int,
    *,
    log_dir: str | os.PathLike,
    cpu: int | None,
    kv_transfer_config: dict | None = None,
    args: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
    simulate: bool = True,
) -> ServerProcess:
    """`ascend-vllm serve MODEL --host <host's address> --port PORT [args]` on `host`; call `wait_healthy`."""
    return start_serve(name, model, port, log_dir=log_dir, cpu=cpu, netns=host, kv_transfer_config=kv_transfer_config,
                       args=args, env_extra=env_extra, simulate=simulate, host=host.address)


def start_router_on(
    host: Host,
    name: str,
    port: int,
    *,
    prefill: list[str],
    decode: list[str],
    log_dir: str | os.PathLike,
    args: list[str] | None = None,
) -> ServerProcess:
    """`ascend-vllm router --host <host's address> --prefill URL … --decode URL …` on `host`."""
    return start_router(name, port, prefill=prefill, decode=decode, log_dir=log_dir, netns=host, args=args,
                        host=host.address)
