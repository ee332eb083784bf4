"""`ascend-vllm serve` and `ascend-vllm router` started on one host of a `Topology` (`ascend_testkit.hosts`), bound
to that host's own address, as a user starts them on each machine of a multi-host deployment.

The processes are `ascend_testkit.servers.ServerProcess`es (process group, log, bounded health wait, kill); only
the bind address and the connector's `side_channel_host` differ from the one-namespace servers.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ascend_testkit.hosts import Host
from ascend_testkit.reach.collect import reach_env
from ascend_testkit.servers import ServerProcess, p2p_kv_config, serve_env, tiny_serve_args


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
    log_dir = Path(log_dir)
    argv = [sys.executable, "-m", "ascend_vllm.cli", "serve", str(model), "--host", host.address, "--port", str(port)]
    argv += args if args is not None else tiny_serve_args()
    if kv_transfer_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_transfer_config)]
    env = serve_env(log_dir / f"cache-{name}", cpu, simulate=simulate, extra=env_extra)
    return ServerProcess(
        name, argv, port=port, env=env, log_path=log_dir / f"{name}.log", netns=host, host=host.address
    )


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
    argv = [sys.executable, "-m", "ascend_vllm.cli", "router", "--host", host.address, "--port", str(port)]
    for url in prefill:
        argv += ["--prefill", url]
    for url in decode:
        argv += ["--decode", url]
    argv += list(args or [])
    env = dict(os.environ) | reach_env()
    return ServerProcess(
        name, argv, port=port, env=env, log_path=Path(log_dir) / f"{name}.log", netns=host, host=host.address
    )
