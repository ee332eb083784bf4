"""Fixtures of the KV pool tests: token ids of the tiny model, `mooncake_master` in the session's loopback-only
namespace, and engines on the session's hosts (`ascend_testkit.engine`; vLLM's CPU platform, one core each).

Engines that need their own process environment (a PYTHONHASHSEED, the fault switches) get their own host
(`own_host`), closed at session end; the others run on the shared warm hosts of the KV transfer suites.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent

ENGINE_DEFAULTS = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=1024, max_num_seqs=4,
                       block_size=128, enable_prefix_caching=True)


@pytest.fixture(scope="session")
def here() -> Path:
    return HERE


@pytest.fixture(scope="session")
def start_master(netns, tmp_path_factory):
    """`start_master(rpc_port, **flags)`: a mooncake_master in the namespace; every one is stopped at session end."""
    from ascend_testkit.mooncake_master import MooncakeMaster

    root = tmp_path_factory.mktemp("masters")
    started = []

    def start(rpc_port: int, **flags):
        master = MooncakeMaster(netns, root / f"master-{rpc_port}.log", rpc_port=rpc_port, flags=flags)
        started.append(master)
        return master

    yield start
    for master in started:
        master.close()


@pytest.fixture(scope="session")
def shared_host(netns_host):
    """`shared_host(cpu)`: the session's warm CPU-lane host pinned to `cpu` inside the namespace."""
    def get(cpu: int):
        return netns_host("cpu", cpu)

    return get


@pytest.fixture(scope="session")
def own_host(tmp_path_factory, netns):
    """`own_host(name, cpu, env)`: a host process of its own (process-start env); closed at session end."""
    from ascend_testkit.engine import EngineHost

    root = tmp_path_factory.mktemp("pool-hosts")
    hosts = []

    def make(name: str, cpu: int, env: dict[str, str]):
        host = EngineHost(name, lane="cpu", runner="v1", log_dir=root, cpus=cpu, env=env, netns=netns)
        hosts.append(host)
        return host

    yield make
    for host in hosts:
        host.close()
    leftovers = [h.proc.pid for h in hosts if h.alive]
    assert not leftovers, f"engine hosts still running: {leftovers}"


@pytest.fixture(scope="session")
def engine_defaults() -> dict:
    return dict(ENGINE_DEFAULTS)


@pytest.fixture(scope="session")
def start_engine():
    """`start_engine(host, model, kv_transfer_config, wait=True, **engine)`: an engine on `host` (LLM keyword
    arguments over the suite's defaults); with wait=False, call `host.started()` later."""
    def start(host, model: str, kv_transfer_config: dict, wait: bool = True, **engine):
        host.start(model, wait=wait, **(ENGINE_DEFAULTS | engine | {"kv_transfer_config": kv_transfer_config}))
        return host

    return start
