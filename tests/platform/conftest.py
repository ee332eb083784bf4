"""The platform suite's engines: vLLM's own CPU platform (the reference) and ours in the simulated-NPU lane.

`platform_runs` runs each engine once per session on the shared hosts (see tests/conftest.py) and keeps what it saw:
outputs with top-5 logprobs, our usage markers, sleep/wake states, start-up errors. The demo runs beside them as a
user types it (`ascend-vllm demo --json`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.reach.collect import reach_env

BLOCK_SIZE = 32
PROMPT_LENGTHS = (5, 31, 33, 70, 100)  # inside one block, at and across block edges, chunked (64-token budget)
MAX_TOKENS = 24
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, block_size=BLOCK_SIZE,
              max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False, seed=0)
BAD_CONFIGS = [{"no_such_option": 1}, {"graph_mode": "warp-speed"}]
DEMO_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def run_engine(host, model, prompts, *, sleep_levels: tuple[int, ...] = (), **engine) -> dict:
    """Start an engine, generate greedily with top-5 logprobs, read our usage markers, then for each sleep level:
    sleep, wake (weights first, then the KV cache; level 2 reloads the weights as a user must), generate again."""
    started = host.start(model, **(ENGINE | engine))
    result = {"startup_s": started["startup_s"], "platform": started["platform"], "runner": started["runner"]}
    before = host.usage()[0]["counts"] if host.lane == "simulated" else {}
    result["outputs"] = host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=5)["outputs"]
    if host.lane == "simulated":
        result["usage"] = host.usage()[0]
        # The host's counters are process-wide (its earlier engines too): what this generation alone ran.
        result["ran"] = {k: v - before.get(k, 0) for k, v in result["usage"]["counts"].items() if v > before.get(k, 0)}
    for level in sleep_levels:
        host.sleep(level=level)
        asleep = host.usage()[0]["sleep"]
        host.wake_up(["weights"])
        host.wake_up(["kv_cache"])
        if level == 2:
            host.rpc("ascend_testkit.probes:reload_weights")
        result[f"sleep{level}"] = {
            "asleep": asleep, "awake": host.usage()[0]["sleep"],
            "outputs": host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=5)["outputs"]}
    host.stop()
    return result


class PlatformRuns:
    """Each engine of the suite, run on first use and remembered for the session."""

    def __init__(self, request, sim_v1_host, cpu_host, model, gqa_model, prompts) -> None:
        self.request, self.sim, self.cpu = request, sim_v1_host, cpu_host
        self.model, self.gqa_model, self.prompts = model, gqa_model, prompts
        self.results: dict[str, dict] = {}

    @property
    def sim_v2(self):
        """The MRV2 host, asked for only by the MRV2 runs: where MRV2 is refused (release lane) those skip alone."""
        return self.request.getfixturevalue("sim_host")

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = getattr(self, f"_run_{name}")()
        return self.results[name]

    def _run_cpu(self) -> dict:
        return run_engine(self.cpu, self.model, self.prompts)

    def _run_cpu_gqa(self) -> dict:
        return run_engine(self.cpu, self.gqa_model, self.prompts)

    def _run_ascend_v1(self) -> dict:
        return run_engine(self.sim, self.model, self.prompts, sleep_levels=(1,), enable_sleep_mode=True,
                          additional_config={"kernel_checks": True})

    def _run_ascend_v2(self) -> dict:
        return run_engine(self.sim_v2, self.model, self.prompts, sleep_levels=(1, 2), enable_sleep_mode=True,
                          additional_config={"kernel_checks": True})

    def _run_ascend_v2_gqa(self) -> dict:
        return run_engine(self.sim_v2, self.gqa_model, self.prompts)

    def _run_ascend_310p(self) -> dict:
        return run_engine(self.sim, self.model, self.prompts, additional_config={"chip": "310P"})

    def _run_bad_config(self) -> dict:
        errors = [self.sim.start_error(self.model, **(ENGINE | {"additional_config": bad}))
                  for bad in BAD_CONFIGS]
        return {"startup_errors": errors}


@pytest.fixture(scope="session")
def gqa_model(cache_root):
    """A tiny Llama with grouped-query attention (4 query heads share each of 2 KV heads)."""
    from ascend_testkit.models.tiny_llama import TinyModelSpec, cached_tiny_llama

    return cached_tiny_llama(TinyModelSpec(num_heads=8, num_kv_heads=2, head_dim=32), cache_dir=cache_root / "models")


@pytest.fixture(scope="session")
def platform_runs(request, sim_v1_host, cpu_host, tiny_model, gqa_model, prompts) -> PlatformRuns:
    return PlatformRuns(request, sim_v1_host, cpu_host, tiny_model, gqa_model, prompts)


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, cache_root):
    """`ascend-vllm demo --json` as a user runs it (its own process, vLLM's default multiprocess engine)."""
    log_path = tmp_path_factory.mktemp("demo") / "demo.log"
    env = {**os.environ, "VLLM_CACHE_ROOT": str(log_path.parent / "vllm-cache"), **reach_env()}
    env.pop("ASCEND_VLLM_SIMULATE", None)  # the demo turns the simulated lane on itself
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ascend_vllm.cli", "demo", "--json", "--prompts", "2",
                                 "--max-tokens", "8", "--cache-dir", str(cache_root)],
                                env=env, stdout=subprocess.PIPE, stderr=log, text=True, start_new_session=True)

    def result() -> dict:
        try:
            out, _ = proc.communicate(timeout=DEMO_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            pytest.fail(f"the demo did not finish in {DEMO_TIMEOUT_S}s; log: {log_path}")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            pytest.fail(f"the demo failed (exit {proc.returncode}); log tail:\n{log_path.read_text()[-4000:]}")
        return json.loads(lines[-1]) | {"_log": log_path.read_text(), "_stdout": out}

    yield result
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
