"""Shared fixtures for the engine-level KV transfer tests: the tiny model's token ids and engines on the session's
hosts (real vLLM engines, each pinned to its own core, inside the loopback-only namespace where Mooncake runs).

Every connector suite runs in two lanes: vLLM's own CPU platform (vLLM's allocator and attention) and the
simulated-NPU lane (our platform: our allocator's views and 2 MiB-aligned buffers, our attention backend, sleep
mode). A module's engines are shared by its tests of one lane (`LANES`, a module-scoped parameter).
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


# The simulated lane serves sleep mode (vLLM's CPU platform does not).
LANE_DEFAULTS = {"cpu": {}, "simulated": {"enable_sleep_mode": True}}
ENGINE_DEFAULTS = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=1024, max_num_seqs=4,
                       block_size=128, enable_prefix_caching=True)


@pytest.fixture(scope="session")
def start_engine(host_pool, netns_host):
    """`start_engine(name, config, cpu, netns=None, wait=True, lane="cpu", runner=None)`: an engine on the session's
    host for (lane, runner, namespace, core); `config` is {model, kv_transfer_config, block_size, ...} (LLM keyword
    arguments); `runner` "v1"/"v2" picks vLLM's model runner (default: vLLM's choice in that lane, V1 on vLLM's CPU
    platform, MRV2 in the simulated lane). With wait=False, call `host.started()` later (two engines then start
    together)."""

    def start(name: str, config: dict, cpu: int, netns=None, wait: bool = True, lane: str = "cpu",
              runner: str | None = None):
        from ascend_testkit.engine import default_runner

        # vLLM's own choice in each lane (the simulated lane runs MRV2 through Triton's interpreter where it can).
        runner = runner or default_runner(lane)
        host = (netns_host(lane, cpu, runner) if netns is not None
                else host_pool.get(f"{lane}-{runner}-cpu{cpu}", lane=lane, runner=runner, cpus=cpu))
        engine = ENGINE_DEFAULTS | LANE_DEFAULTS[lane] | {k: v for k, v in config.items() if k != "model"}
        host.start(config["model"], wait=wait, **engine)
        return host

    return start


@pytest.fixture(scope="session")
def pd_pair(start_engine, netns):
    """`with pd_pair(names, common, kv_configs, lane) as (prefill, decode)`: a prefill engine on core 0 and a decode
    engine on core 1 in the loopback namespace, started together; stopped on exit unless a fault test killed one."""

    @contextlib.contextmanager
    def pair(names: tuple[str, str], common: dict, kv_configs: tuple[dict, dict], lane: str):
        hosts = [start_engine(name, common | {"kv_transfer_config": kv}, cpu, netns=netns, wait=False, lane=lane)
                 for cpu, (name, kv) in enumerate(zip(names, kv_configs, strict=True))]
        try:
            for host in hosts:
                host.started()
            yield tuple(hosts)
        finally:
            for host in hosts:
                if host.alive:
                    host.stop()

    return pair


@pytest.fixture(scope="module", params=["cpu", "simulated"])
def lane(request) -> str:
    """The lane of a module's engines: each connector module runs once per lane, its engines shared by its tests."""
    return request.param


def _registration(host) -> dict:
    worker = host.call("stats")["worker"]
    return {"registered": sorted(worker["registered"]), "registrations": worker["registrations"],
            "storages": sorted(host.rpc("ascend_testkit.probes:kv_storages")[0])}


@pytest.fixture(scope="session")
def registration():
    """`registration(host)`: the worker connector's registered KV memory ([address, bytes] spans), how often it
    registered, and the spans of our allocator's buffers behind the layers' views (simulated lane; [] otherwise)."""
    return _registration


@pytest.fixture
def run_in_netns(netns, tmp_path):
    """Run a helper script of this folder inside the namespace; returns the Popen (stdin/stdout pipes)."""
    import subprocess

    procs, logs = [], []

    def run(script: str, *args: str) -> subprocess.Popen:
        logs.append(open(tmp_path / f"{script}.{len(logs)}.log", "wb"))  # noqa: SIM115 - closed at teardown
        proc = netns.popen([sys.executable, str(HERE / script), *args], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, stderr=logs[-1])
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream:
                stream.close()
    for log in logs:
        log.close()
