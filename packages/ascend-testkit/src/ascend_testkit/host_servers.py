"""`ascend-vllm serve` and `ascend-vllm router` started on one host of a `Topology` (`ascend_testkit.hosts`), bound
to that host's own address, as a user starts them on each machine of a multi-host deployment.

The processes are `ascend_testkit.servers`' own `start_serve` / `start_router` servers; only the bind address, the
namespace and the connector's `side_channel_host` differ from the one-namespace servers. `start_tp_node_on` and
`start_dp_node_on` start one node of vLLM's own multi-node launches (tensor / data parallel across hosts), with the
environment each node needs (`node_env`).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

from ascend_testkit.hosts import Host
from ascend_testkit.servers import ServerProcess, p2p_kv_config, start_router, start_serve, tiny_serve_args


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


def node_env(host: Host, peer: str) -> dict[str, str]:
    """What a user sets on each machine of a multi-node vLLM deployment, for `host`: vLLM's own address
    (`VLLM_HOST_IP`: where the other nodes reach this node's message queues; vLLM otherwise asks the default route,
    which a test host has none of) and the interface gloo's process groups use (`GLOO_SOCKET_IFNAME`: gloo otherwise
    binds the address the machine's hostname resolves to, which is not on a test host, and falls back to loopback,
    which the other node cannot reach). The interface is `host`'s link to `peer`."""
    return {"VLLM_HOST_IP": host.address, "GLOO_SOCKET_IFNAME": host.links[peer]}


def start_tp_node_on(
    host: Host,
    name: str,
    model: str | os.PathLike,
    port: int,
    *,
    peer: str,
    master: Host,
    master_port: int,
    node_rank: int,
    nnodes: int,
    tensor_parallel_size: int,
    log_dir: str | os.PathLike,
    cpu: int | str | None,
    args: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
) -> ServerProcess:
    """One node of vLLM's mp multi-node launch, `ascend-vllm serve MODEL --nnodes N --node-rank R --master-addr
    <master's address> --master-port P --tensor-parallel-size T [--headless]` on `host` (every node but rank 0 is
    headless: it runs its workers and no API server, so only rank 0's `wait_healthy` means anything; rank 0 is healthy
    once every node's workers joined)."""
    node_args = ["--tensor-parallel-size", str(tensor_parallel_size), "--nnodes", str(nnodes), "--node-rank",
                 str(node_rank), "--master-addr", master.address, "--master-port", str(master_port)]
    if node_rank > 0:
        node_args.append("--headless")
    return _start_node_on(host, name, model, port, node_args, peer=peer, log_dir=log_dir, cpu=cpu, args=args,
                          env_extra=env_extra)


def start_dp_node_on(
    host: Host,
    name: str,
    model: str | os.PathLike,
    port: int,
    *,
    peer: str,
    master: Host,
    rpc_port: int,
    start_rank: int,
    data_parallel_size: int,
    log_dir: str | os.PathLike,
    cpu: int | str | None,
    args: list[str] | None = None,
    env_extra: dict[str, str] | None = None,
) -> ServerProcess:
    """One node of vLLM's multi-node data parallelism, one DP rank per node: `ascend-vllm serve MODEL
    --data-parallel-size N --data-parallel-size-local 1 --data-parallel-address <master's address>
    --data-parallel-rpc-port P [--data-parallel-start-rank R --headless]` on `host` (rank 0 serves the API and is
    healthy once every rank's engine registered with it; the others are headless)."""
    node_args = ["--data-parallel-size", str(data_parallel_size), "--data-parallel-size-local", "1",
                 "--data-parallel-address", master.address, "--data-parallel-rpc-port", str(rpc_port)]
    if start_rank > 0:
        node_args += ["--data-parallel-start-rank", str(start_rank), "--headless"]
    return _start_node_on(host, name, model, port, node_args, peer=peer, log_dir=log_dir, cpu=cpu, args=args,
                          env_extra=env_extra)


def _start_node_on(host: Host, name: str, model: str | os.PathLike, port: int, node_args: list[str], *, peer: str,
                   log_dir: str | os.PathLike, cpu: int | str | None, args: list[str] | None,
                   env_extra: dict[str, str] | None) -> ServerProcess:
    return start_serve_on(host, name, model, port, log_dir=log_dir, cpu=cpu,
                          args=[*(args if args is not None else tiny_serve_args()), *node_args],
                          env_extra={**node_env(host, peer), **(env_extra or {})})


@contextlib.contextmanager
def two_nodes(start_node: Callable[[int], ServerProcess], reference: Callable[[], object]
              ) -> Iterator[tuple[ServerProcess, ServerProcess, object]]:
    """Node 0 and node 1 of a multi-node launch (`start_node(rank)`), with `reference()` (the single engine's answers)
    run while they come up; yields (node 0, node 1, those answers) once node 0 is healthy, which it is only when node
    1 joined. On exit both are stopped (SIGTERM, then closed), and one that outlives that is an error."""
    started: list[ServerProcess] = []
    try:
        for rank in (0, 1):
            started.append(start_node(rank))
        expected = reference()
        started[0].wait_healthy(timeout=600)
        assert started[1].alive, started[1].log_tail()
        yield started[0], started[1], expected
    finally:
        for server in started:
            server.signal(signal.SIGTERM)
        for server in started:
            server.close()
    leftovers = [s.name for s in started if s.alive]
    assert not leftovers, f"servers still running: {leftovers}"


def node_cpus() -> tuple[str, str]:
    """The cores of a two-node deployment's nodes: one each, or both on a test-all shard's own core
    (`ASCEND_TESTKIT_CPUS`)."""
    shard = os.environ.get("ASCEND_TESTKIT_CPUS")
    return (shard, shard) if shard else ("0", "1")
