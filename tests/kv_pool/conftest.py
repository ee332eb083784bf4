"""Fixtures of the KV pool tests: the tiny model, a loopback-only network namespace, `mooncake_master`, and engine
hosts (real vLLM engines on the CPU platform, one core each) that are always reaped.

The engine harness is imported here only (`start_engine`), so switching it is a one-place change.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def here() -> Path:
    return HERE


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory) -> str:
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    cache = os.environ.get("ASCEND_VLLM_CACHE")
    root = Path(cache) / "models" if cache else tmp_path_factory.mktemp("models")
    return str(cached_tiny_llama(cache_dir=root))


@pytest.fixture(scope="session")
def token_ids(model_dir):
    """`token_ids(n, offset)`: a prompt of exactly n token ids (distinct offsets give distinct prompts)."""
    from transformers import AutoTokenizer

    from ascend_testkit.models.tiny_llama import prompt_of_length

    tok = AutoTokenizer.from_pretrained(model_dir)

    def make(n: int, offset: int = 0) -> list[int]:
        ids = tok(prompt_of_length(n, offset=offset))["input_ids"]
        assert len(ids) == n
        return ids

    return make


@pytest.fixture(scope="session")
def netns():
    from ascend_testkit.netns import LoopbackNamespace, NetnsUnavailableError

    try:
        ns = LoopbackNamespace()
    except NetnsUnavailableError as e:
        pytest.skip(f"needs a loopback-only network namespace: {e}")
    yield ns
    ns.close()


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
def start_engine(tmp_path_factory):
    """`start_engine(name, config, cpu, netns=None, wait=True, env=None)`; every host is shut down at session end."""
    from ascend_kv_transfer.engine_harness.client import EngineProcess, engine_env

    root = tmp_path_factory.mktemp("engines")
    started: list[EngineProcess] = []

    def start(name: str, config: dict, cpu: int, netns=None, wait: bool = True, env: dict | None = None):
        proc = EngineProcess(config, env=engine_env(root / f"cache-{name}", cpu, env), log_path=root / f"{name}.log",
                             netns=netns, wait=wait)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()
    leftovers = [p.proc.pid for p in started if p.proc.poll() is None]
    assert not leftovers, f"engine hosts still running: {leftovers}"
