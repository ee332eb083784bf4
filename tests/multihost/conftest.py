"""Three hosts on this machine (`ascend_testkit.hosts.Topology`): a prefill server on host "prefill", a decode server
on host "decode", the router on host "router", each bound to its host's own address, every pair linked by a veth
pair. The test process is the client: it enters the router's host to send requests (that host reaches the others
only over its links)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from ascend_testkit.hosts import tbf_queue_delay_s
from ascend_testkit.servers import ServerProcess

ROUTER_PORT = 8000
PREFILL_PORT = 8100
DECODE_PORT = 8200
SIDE_CHANNEL_PORTS = {"prefill": 30300, "decode": 30400}
# The slowest rate the fault tests limit the prefill-decode link to (test_pd_across_hosts.SLOW_RATE). Its queue holds
# ~8 s of KV bytes, and a side-channel reply (a second request's claim answer) waits behind them: with a 2 s handshake
# bound that claim timed out and its request was recomputed before the test's kill landed.
SLOWEST_LINK_RATE = "250kbit"
# The connector's bounds: a transfer nobody claims (or finishes) is released after abort_timeout_s; a side-channel
# message outlasts the slowest link's queueing delay.
KV_BOUNDS = {"abort_timeout_s": 10.0, "handshake_timeout_s": math.ceil(tbf_queue_delay_s(SLOWEST_LINK_RATE)) + 2.0,
             "claim_wait_s": 3.0}
# Mooncake's TCP transport drops a connection that made no progress for this long (default 30 s): what bounds a pull
# stalled on a cut link, since the stalled read is inside Mooncake.
MOONCAKE_ENV = {"MC_TCP_PROGRESS_TIMEOUT_SEC": "8"}
ROUTER_ARGS = ["--health-interval", "1", "--health-timeout", "2", "--read-timeout", "60", "--prefill-timeout", "60"]
READ_TIMEOUT_S = 60.0


@dataclass
class HostsServing:
    topo: object
    prefill: ServerProcess
    decode: ServerProcess
    router: ServerProcess
    kv_bounds: dict
    progress_timeout_s: float
    read_timeout_s: float = READ_TIMEOUT_S

    def client(self, server: ServerProcess, timeout: float = 120.0):
        return server.openai_client(timeout)


def _topology(names: list[str]):
    from ascend_testkit.hosts import Topology
    from ascend_testkit.netns import NetnsUnavailableError

    try:
        return Topology(names)
    except NetnsUnavailableError as e:
        pytest.fail(f"needs network namespaces (root, util-linux, iproute2): {e}")


@pytest.fixture(scope="module")
def topo():
    t = _topology(["prefill", "decode", "router"])
    yield t
    t.close()


@pytest.fixture(scope="module")
def node_topo():
    """Two hosts, "node0" and "node1", for a multi-node launch across them."""
    t = _topology(["node0", "node1"])
    yield t
    t.close()


@pytest.fixture(scope="module")
def lane_outputs(host_pool):
    """`lane_outputs(model, engine, prompts, max_tokens)`: greedy outputs (with logprobs) of one engine of the
    simulated lane on its shared host (`sim_host`): the single engine a multi-node deployment is held to."""

    def run(model, engine: dict, prompts: list, max_tokens: int) -> list[dict]:
        single = host_pool.get("sim", lane="simulated", runner=None)
        single.start(model, wait=False, **engine)
        single.started()
        try:
            return single.generate(prompts, max_tokens=max_tokens, logprobs=1, ignore_eos=True)["outputs"]
        finally:
            single.stop()

    return run


@pytest.fixture(scope="module")
def hosts_serving(tmp_path_factory, tiny_model, topo) -> HostsServing:
    from ascend_testkit.host_servers import host_kv_config, start_router_on, start_serve_on

    logs = tmp_path_factory.mktemp("multihost")
    dev = {"VLLM_SERVER_DEV_MODE": "1", **MOONCAKE_ENV}
    started = []
    try:
        for cpu, (role, kind) in enumerate((("prefill", "kv_producer"), ("decode", "kv_consumer"))):
            host = topo[role]
            kv = host_kv_config(host, kind, SIDE_CHANNEL_PORTS[role], role, **KV_BOUNDS)
            port = PREFILL_PORT if role == "prefill" else DECODE_PORT
            started.append(
                start_serve_on(
                    host, role, tiny_model, port, log_dir=logs, cpu=cpu, kv_transfer_config=kv, env_extra=dev
                )
            )
        for server in started:
            server.wait_healthy()
        router = start_router_on(
            topo["router"],
            "router",
            ROUTER_PORT,
            prefill=[started[0].url],
            decode=[started[1].url],
            log_dir=logs,
            args=ROUTER_ARGS,
        )
        started.append(router)
        router.wait_healthy(timeout=60)
        yield HostsServing(
            topo, started[0], started[1], router, KV_BOUNDS, float(MOONCAKE_ENV["MC_TCP_PROGRESS_TIMEOUT_SEC"])
        )
    finally:
        for server in started:
            server.close()
    leftovers = [s.name for s in started if s.alive]
    assert not leftovers, f"servers still running: {leftovers}"


@pytest.fixture
def serving(hosts_serving):
    """The servers, with this test's thread on the router's host (the client's place)."""
    from ascend_testkit.servers import inside

    with inside(hosts_serving.topo["router"]):
        yield hosts_serving


@pytest.fixture(scope="module")
def restart_on(tmp_path_factory, tiny_model, hosts_serving):
    """`restart_on(role)`: a fresh "prefill" or "decode" server on that role's host, started as `hosts_serving`
    started the first (same address, port, side channel and connector bounds), waited healthy and put in its place
    in `hosts_serving`; every one is closed at module end."""
    from ascend_testkit.host_servers import host_kv_config, start_serve_on

    logs = tmp_path_factory.mktemp("multihost-restarts")
    started = []

    def restart(role: str) -> ServerProcess:
        host = hosts_serving.topo[role]
        kind = "kv_producer" if role == "prefill" else "kv_consumer"
        kv = host_kv_config(host, kind, SIDE_CHANNEL_PORTS[role], role, **KV_BOUNDS)
        port = PREFILL_PORT if role == "prefill" else DECODE_PORT
        server = start_serve_on(host, f"{role}-{len(started) + 2}", tiny_model, port, log_dir=logs,
                                cpu=0 if role == "prefill" else 1, kv_transfer_config=kv,
                                env_extra={"VLLM_SERVER_DEV_MODE": "1", **MOONCAKE_ENV})
        started.append(server)
        server.wait_healthy()
        setattr(hosts_serving, role, server)
        return server

    yield restart
    for server in started:
        server.close()
    leftovers = [s.name for s in started if s.alive]
    assert not leftovers, f"restarted servers still running: {leftovers}"
