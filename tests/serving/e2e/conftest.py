"""Servers as users deploy them, shared by the end-to-end serving tests: `ascend-vllm serve` processes on our platform
in the simulated-NPU lane, and `ascend-vllm router` in front of them, all inside one loopback-only network namespace.

One session starts three engines at once (their start-ups overlap): a prefill server (kv_producer, core 0) that is
also the single-server reference (a request without kv_transfer_params is served like on any server), and two
decode servers (kv_consumer, core 1). The router is told about one more prefill server that never runs. Tests that
kill a server are marked `kills_servers` and run last. The servers live as long as this package's tests (package
scope: this folder has an `__init__.py` for that), not until the end of the whole session.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from ascend_testkit.servers import ServerProcess

ROUTER_PORT = 8000
PREFILL_PORT = 8100
DEAD_PREFILL_PORT = 8199
DECODE_PORTS = (8200, 8201)
SIDE_CHANNEL_PORTS = {"prefill": 30300, "decode0": 30400, "decode1": 30500}
# Bounds the router runs with here: a failure shows within seconds, a hang within READ_TIMEOUT_S.
ROUTER_ARGS = ["--health-interval", "1", "--health-timeout", "2", "--read-timeout", "60", "--prefill-timeout", "60",
               "--log-level", "info"]
READ_TIMEOUT_S = 60.0


def pytest_configure(config):
    config.addinivalue_line("markers", "kills_servers: kills a shared server; runs after every other serving test")


def pytest_collection_modifyitems(config, items):
    """Within this folder's tests (they stay where they are in the session), the ones that kill servers go last."""
    here = Path(__file__).parent
    slots = [i for i, item in enumerate(items) if here in Path(item.path).parents]
    ours = sorted((items[i] for i in slots), key=lambda item: item.get_closest_marker("kills_servers") is not None)
    for i, item in zip(slots, ours, strict=True):
        items[i] = item


@dataclass
class Serving:
    netns: object
    prefill: ServerProcess
    decodes: list[ServerProcess]
    router: ServerProcess
    dead_prefill_url: str
    read_timeout_s: float = READ_TIMEOUT_S

    def client(self, server: ServerProcess, timeout: float = 120.0):
        return server.openai_client(timeout)


@pytest.fixture(scope="package")
def serving_netns():
    """A namespace of these servers' own: their fixed ports cannot meet the ports of other suites' engines."""
    from ascend_testkit.netns import LoopbackNamespace, NetnsUnavailableError

    try:
        ns = LoopbackNamespace()
    except NetnsUnavailableError as e:
        pytest.fail(f"needs a loopback-only network namespace (run as root with util-linux and iproute2): {e}")
    yield ns
    ns.close()


@pytest.fixture(scope="package")
def serving_session(tmp_path_factory, tiny_model, serving_netns) -> Serving:
    from ascend_testkit.servers import p2p_kv_config, start_router, start_serve

    logs = tmp_path_factory.mktemp("serving")
    # Development endpoints let a test ask the workers which platform, runner and attention ran (ascend_usage).
    dev = {"VLLM_SERVER_DEV_MODE": "1"}
    kv = {"abort_timeout_s": 30.0, "handshake_timeout_s": 2.0, "claim_wait_s": 3.0}
    started = [start_serve("prefill", tiny_model, PREFILL_PORT, log_dir=logs, cpu=0, netns=serving_netns,
                           env_extra=dev, kv_transfer_config=p2p_kv_config(
                               "kv_producer", SIDE_CHANNEL_PORTS["prefill"], "prefill", **kv))]
    for i, port in enumerate(DECODE_PORTS):
        started.append(start_serve(f"decode{i}", tiny_model, port, log_dir=logs, cpu=1, netns=serving_netns,
                                   env_extra=dev, kv_transfer_config=p2p_kv_config(
                                       "kv_consumer", SIDE_CHANNEL_PORTS[f"decode{i}"], f"decode{i}", **kv)))
    try:
        for server in started:
            server.wait_healthy()
        dead = f"http://127.0.0.1:{DEAD_PREFILL_PORT}"
        router = start_router("router", ROUTER_PORT, prefill=[dead, started[0].url],
                              decode=[s.url for s in started[1:]], log_dir=logs, netns=serving_netns,
                              args=ROUTER_ARGS)
        started.append(router)
        router.wait_healthy(timeout=60)
        yield Serving(serving_netns, started[0], started[1:3], router, dead)
    finally:
        for server in started:
            server.close()
    leftovers = [s.name for s in started if s.alive]
    assert not leftovers, f"servers still running: {leftovers}"


@pytest.fixture
def serving(serving_session):
    """The shared servers, with this test's thread inside their namespace (its clients reach 127.0.0.1 there)."""
    from ascend_testkit.servers import inside

    # A server that died between tests (e.g. the kernel's OOM killer took its engine) would fail this test in ways
    # that do not say so: name it first.
    servers = [serving_session.prefill, *serving_session.decodes, serving_session.router]
    gone = [why for why in (s.died_on_its_own() for s in servers) if why]
    assert not gone, "a shared server died before this test:\n" + "\n".join(gone)
    with inside(serving_session.netns):
        yield serving_session
