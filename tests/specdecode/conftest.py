"""Engine-level speculative-decoding tests: shared models and the engines of both lanes, started once per session.

Lanes: the simulated-NPU lane (``ASCEND_VLLM_SIMULATE=1``: the Ascend platform runs the engine and wires the
speculators itself) carries the full proof: a no-speculation baseline, every self-draft and every random draft.
vLLM's own CPU platform (``SpecDecodeCPUWorker``) runs one engine, an EAGLE self-draft, to show the package works
there too. Each lane's engines run one after another in ONE process (`engine_batch.py`: in-process engine core,
single-process executor), because ~35 of an engine's ~40 s start-up here is processes importing vLLM; both lanes'
processes start together at the first test that needs them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ascend_testkit.models.tiny_llama import cached_tiny_llama, prompt_of_length

K = 3
WINDOW = 4
PROMPTS = [prompt_of_length(16, offset=37 * i) for i in range(3)]
MAX_TOKENS = 40
ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 256,
    "enforce_eager": True,
    "max_num_seqs": 4,
    "block_size": 32,
    "seed": 0,
}
SIMULATED = "simulated-npu"
VLLM_CPU = "vllm-cpu"
BASELINE = "baseline"
# Cases are "<method>-<draft>"; the simulated lane runs all of them, vLLM's CPU platform one.
LANE_CASES = {
    SIMULATED: [BASELINE, "draft_model-self", "eagle-self", "draft_model-random", "eagle-random", "dflash-random"],
    VLLM_CPU: ["eagle-self"],
}
DRIVER = Path(__file__).with_name("engine_batch.py")
RESULT_PREFIX = "SPECDECODE_BATCH_RESULT "
TIMEOUT_S = 900


@pytest.fixture(scope="session")
def workload() -> dict:
    """What every case generates: the numbers the tests compare against."""
    return {"k": K, "prompts": PROMPTS, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="session")
def specdecode_cache(tmp_path_factory) -> Path:
    root = os.environ.get("ASCEND_VLLM_CACHE")
    return Path(root) / "models" if root else tmp_path_factory.mktemp("specdecode-models")


@pytest.fixture(scope="session")
def draft_models(specdecode_cache) -> dict[str, str]:
    """The target (an EAGLE-compatible tiny Llama, see draft_checkpoints) and one draft per case."""
    from ascend_testkit.models import drafts as dc

    base = cached_tiny_llama(cache_dir=specdecode_cache)
    target = dc.eagle_compatible_target(base, sliding_window=WINDOW)
    return {
        "target": str(target),
        "draft_model-self": str(target),
        "eagle-self": str(dc.eagle_draft(target, specdecode_cache / f"{target.name}-eagle-self", self_draft=True)),
        "eagle-random": str(dc.eagle_draft(target, specdecode_cache / f"{target.name}-eagle-rand", self_draft=False)),
        "draft_model-random": str(dc.random_llama_draft(target, specdecode_cache / f"{target.name}-llama-rand")),
        "dflash-random": str(dc.dflash_draft(target, specdecode_cache / f"{target.name}-dflash-rand")),
    }


def _job(case: str, lane: str, models: dict[str, str]) -> dict:
    engine_kwargs = dict(ENGINE_KWARGS)
    if lane == VLLM_CPU:
        engine_kwargs["worker_cls"] = "ascend_specdecode.cpu_worker.SpecDecodeCPUWorker"
    spec = None
    if case != BASELINE:
        method = case.rsplit("-", 1)[0]
        spec = {"method": method, "model": models[case], "num_speculative_tokens": K}
    return {"case": case, "model": models["target"], "speculative_config": spec, "prompts": PROMPTS,
            "max_tokens": MAX_TOKENS, "engine_kwargs": engine_kwargs}


class LaneRuns:
    """One `engine_batch.py` process per lane, all started at once; results are read as tests ask for them."""

    def __init__(self, tmp: Path, models: dict[str, str]) -> None:
        self.procs: dict[str, tuple[subprocess.Popen, Path]] = {}
        self.results: dict[str, dict[str, dict]] = {}
        base_env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        for lane, cases in LANE_CASES.items():
            env = dict(base_env, VLLM_CACHE_ROOT=str(tmp / f"vllm-cache-{lane}"))
            env.pop("ASCEND_VLLM_SIMULATE", None)
            if lane == SIMULATED:
                env["ASCEND_VLLM_SIMULATE"] = "1"
            jobs_path, log_path = tmp / f"{lane}.jobs.json", tmp / f"{lane}.log"
            jobs_path.write_text(json.dumps([_job(case, lane, models) for case in cases]))
            with open(log_path, "w") as log:
                proc = subprocess.Popen([sys.executable, str(DRIVER), str(jobs_path)], env=env, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            self.procs[lane] = (proc, log_path)

    def result(self, lane: str, case: str) -> dict:
        if lane not in self.results:
            proc, log_path = self.procs[lane]
            try:
                proc.wait(timeout=TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                pytest.fail(f"{lane} engines did not finish in {TIMEOUT_S}s; log: {log_path}")
            lines = log_path.read_text().splitlines()
            found = [json.loads(line[len(RESULT_PREFIX):]) for line in lines if line.startswith(RESULT_PREFIX)]
            self.results[lane] = {r["case"]: r for r in found}
        got = self.results[lane].get(case)
        if got is None:
            _, log_path = self.procs[lane]
            tail = "\n".join(log_path.read_text().splitlines()[-25:])
            pytest.fail(f"{lane} engine {case!r} reported nothing (exit {self.procs[lane][0].returncode}):\n{tail}")
        if "error" in got:
            pytest.fail(f"{lane} engine {case!r} failed: {got['error']}\n{got['traceback']}")
        return got

    @staticmethod
    def _kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)

    def close(self) -> None:
        deadline = time.monotonic() + 5
        for proc, _ in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            if proc.poll() is None:
                self._kill(proc)


@pytest.fixture(scope="session")
def lane_runs(draft_models, tmp_path_factory):
    runs = LaneRuns(tmp_path_factory.mktemp("specdecode-engines"), draft_models)
    yield runs
    runs.close()


@pytest.fixture(scope="session")
def run_case(lane_runs):
    """`run_case(lane, case)` -> the `ascend_specdecode.measure` result of that engine."""
    return lane_runs.result
