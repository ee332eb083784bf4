"""Shared fixtures for the engine-level KV transfer tests: the tiny model's token ids and engines on the session's
hosts (real vLLM engines, each pinned to its own core, inside the loopback-only namespace where Mooncake runs)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def model_dir(tiny_model) -> str:
    return str(tiny_model)


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


ENGINE_DEFAULTS = dict(dtype="float32", enforce_eager=True, seed=0, max_model_len=1024, max_num_seqs=4,
                       block_size=128, enable_prefix_caching=True)


@pytest.fixture(scope="session")
def start_engine(host_pool, netns_host):
    """`start_engine(name, config, cpu, netns=None, wait=True, lane="cpu")`: an engine on the session's host for
    (lane, namespace, core); `config` is {model, kv_transfer_config, block_size, ...} (LLM keyword arguments).
    With wait=False, call `host.started()` later (two engines then start together)."""

    def start(name: str, config: dict, cpu: int, netns=None, wait: bool = True, lane: str = "cpu"):
        host = (netns_host(lane, cpu) if netns is not None
                else host_pool.get(f"{lane}-v1-cpu{cpu}", lane=lane, runner="v1", cpus=cpu))
        engine = ENGINE_DEFAULTS | {k: v for k, v in config.items() if k != "model"}
        host.start(config["model"], wait=wait, **engine)
        return host

    return start


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
