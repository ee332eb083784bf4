"""Shared fixtures for the engine-level KV transfer tests: the tiny model, a loopback-only network namespace, and
engine hosts (real vLLM engines on the CPU platform, each pinned to its own core) that are always reaped."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


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
def start_engine(tmp_path_factory):
    """`start_engine(name, config, cpu, netns=None, wait=True)`; every host is shut down at session end."""
    from ascend_kv_transfer.engine_harness.client import EngineProcess, engine_env

    root = tmp_path_factory.mktemp("engines")
    started: list[EngineProcess] = []

    def start(name: str, config: dict, cpu: int, netns=None, wait: bool = True) -> EngineProcess:
        env = engine_env(root / f"cache-{name}", cpu)
        proc = EngineProcess(config, env=env, log_path=root / f"{name}.log", netns=netns, wait=wait)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()
    leftovers = [p.proc.pid for p in started if p.proc.poll() is None]
    assert not leftovers, f"engine hosts still running: {leftovers}"


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
