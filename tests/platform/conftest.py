"""Shared engines for the platform e2e tests: each engine runs once per session in its own process.

`engine_runs` starts every engine the suite needs at once (they overlap their ~30-45 s start-ups) through
`engine_driver.py` and hands back each one's JSON. Environment: offline HF hub, 1 GiB KV space, a private vLLM
cache root, the tiny peaked Llama from `ascend_testkit.models.tiny_llama`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

DRIVER = Path(__file__).with_name("engine_driver.py")
TIMEOUT_S = 1200
BLOCK_SIZE = 32
PROMPT_LENGTHS = (5, 31, 33, 70, 100)  # inside one block, at and across block edges, chunked (64-token budget)
MAX_TOKENS = 24


def _v2_runnable() -> tuple[bool, str]:
    # vLLM refuses MRV2 unless Triton has a CPU backend ("Model Runner V2 requires Triton").
    code = "from vllm.triton_utils import HAS_TRITON; print(int(HAS_TRITON))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    ok = out.stdout.strip().endswith("1")
    return ok, "" if ok else "vLLM runs Model Runner V2 only with a Triton CPU backend, which this machine lacks"


class EngineRuns:
    def __init__(self, tmp: Path, model: Path, specs: dict[str, dict]) -> None:
        self.tmp = tmp
        self.procs: dict[str, tuple[subprocess.Popen, Path, Path]] = {}
        self.results: dict[str, dict] = {}
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CACHE_ROOT": str(tmp / "vllm-cache")}
        env.pop("ASCEND_VLLM_SIMULATE", None)
        for name, spec in specs.items():
            spec_path, out_path, log_path = tmp / f"{name}.json", tmp / f"{name}.out.json", tmp / f"{name}.log"
            spec_path.write_text(json.dumps({"model": str(model), **spec}))
            if "argv" in spec:  # a command whose last stdout line is its JSON result (e.g. the demo)
                argv, stdout, stderr = spec["argv"], open(out_path, "w"), open(log_path, "w")  # noqa: SIM115
            else:
                argv = [sys.executable, str(DRIVER), str(spec_path), str(out_path)]
                stdout = stderr = open(log_path, "w")  # noqa: SIM115 (closed right after the start)
            proc = subprocess.Popen(argv, env=env, stdout=stdout, stderr=stderr, start_new_session=True)
            self.procs[name] = (proc, out_path, log_path)
            stdout.close()
            stderr.close()

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            proc, out_path, log_path = self.procs[name]
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                pytest.fail(f"engine {name} did not finish in {TIMEOUT_S}s; log: {log_path}")
            if proc.returncode != 0 or not out_path.exists():
                tail = log_path.read_text()[-4000:]
                pytest.fail(f"engine {name} failed (exit {proc.returncode}); log tail:\n{tail}")
            # vLLM may log its shutdown to stdout after a command's JSON line: take the last JSON object.
            lines = [line for line in out_path.read_text().splitlines() if line.startswith("{")]
            if not lines:
                pytest.fail(f"engine {name} printed no JSON; log: {log_path}")
            self.results[name] = json.loads(lines[-1]) | {"_log": log_path.read_text()}
        return self.results[name]

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        for proc, _, _ in self.procs.values():
            if proc.poll() is None:
                self._kill(proc)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    root = Path(os.environ.get("ASCEND_VLLM_CACHE") or tmp_path_factory.mktemp("cache"))
    return cached_tiny_llama(cache_dir=root / "models")  # the demo's --cache-dir is `root`


@pytest.fixture(scope="session")
def prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


@pytest.fixture(scope="session")
def v2_status() -> tuple[bool, str]:
    return _v2_runnable()


@pytest.fixture(scope="session")
def engine_runs(tmp_path_factory, tiny_model, prompts, v2_status):
    base = {"prompts": prompts, "max_tokens": MAX_TOKENS, "logprobs": 5}
    specs = {
        "cpu": {**base, "platform": "cpu", "runner": "v1"},
        "ascend_v1": {**base, "platform": "ascend", "runner": "v1", "sleep": True,
                      "additional_config": {"kernel_checks": True}},
        "ascend_310p": {**base, "platform": "ascend", "runner": "v1", "additional_config": {"chip": "310P"}},
        "bad_config": {**base, "platform": "ascend", "runner": "v1",
                       "bad_configs": [{"no_such_option": 1}, {"graph_mode": "warp-speed"}]},
    }
    cache = tiny_model.parent.parent
    specs["demo"] = {"argv": [sys.executable, "-m", "ascend_vllm.cli", "demo", "--json", "--prompts", "2",
                              "--max-tokens", "8", "--cache-dir", str(cache)]}
    if v2_status[0]:
        specs["ascend_v2"] = {**base, "platform": "ascend", "runner": "v2",
                              "additional_config": {"kernel_checks": True}}
    runs = EngineRuns(tmp_path_factory.mktemp("engines"), tiny_model, specs)
    yield runs
    runs.close()


def check_logprobs_close(ours: list[dict], theirs: list[dict], *, name_0: str = "ours", name_1: str = "cpu") -> None:
    """vLLM's check_logprobs_close: identical tokens, or at the first divergence each side's token is in the
    other's top-k logprobs (after which the sequences are not compared further)."""
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        for pos, (ta, tb) in enumerate(zip(a["token_ids"], b["token_ids"], strict=False)):
            if ta == tb:
                continue
            top_a, top_b = a["logprobs"][pos], b["logprobs"][pos]
            assert str(ta) in top_b, f"prompt {i} pos {pos}: {name_0} token {ta} not in {name_1} top-k {top_b}"
            assert str(tb) in top_a, f"prompt {i} pos {pos}: {name_1} token {tb} not in {name_0} top-k {top_a}"
            break
        else:
            assert len(a["token_ids"]) == len(b["token_ids"]), f"prompt {i}: lengths differ"


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
