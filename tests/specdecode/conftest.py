"""Engine-level speculative-decoding tests: shared models and the engines of both lanes, started once per session.

Lanes: the simulated-NPU lane (``ASCEND_VLLM_SIMULATE=1``: the Ascend platform runs the engine and wires the
speculators itself) carries the full proof: a no-speculation baseline, every self-draft and every random draft.
vLLM's own CPU platform (``SpecDecodeCPUWorker``) runs one engine, an EAGLE self-draft, to show the package works
there too. Engines run on the session's shared hosts (tests/conftest.py), one after another.
"""

from __future__ import annotations

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


@pytest.fixture(scope="session")
def workload() -> dict:
    """What every case generates: the numbers the tests compare against."""
    return {"k": K, "prompts": PROMPTS, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="session")
def specdecode_cache(cache_root) -> Path:
    return cache_root / "models"


@pytest.fixture(scope="session")
def draft_models(specdecode_cache) -> dict[str, str]:
    """The target (an EAGLE-compatible tiny Llama, see ascend_testkit.models.drafts) and one draft per case."""
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


def _spec(case: str, models: dict[str, str]) -> dict | None:
    if case == BASELINE:
        return None
    return {"method": case.rsplit("-", 1)[0], "model": models[case], "num_speculative_tokens": K}


class CaseRuns:
    """Each lane's cases run on the session's engine hosts (one engine after another), each once, on first use."""

    def __init__(self, hosts: dict, models: dict[str, str]) -> None:
        self.hosts, self.models = hosts, models
        self.results: dict[tuple[str, str], dict] = {}

    def __call__(self, lane: str, case: str) -> dict:
        if case not in LANE_CASES[lane]:
            raise KeyError(f"{case!r} is not a case of the {lane} lane (see LANE_CASES)")
        if (lane, case) not in self.results:
            from ascend_testkit.speculation import measure

            engine = dict(ENGINE_KWARGS)
            if lane == VLLM_CPU:
                engine["worker_cls"] = "ascend_specdecode.cpu_worker.SpecDecodeCPUWorker"
            self.results[(lane, case)] = measure(self.hosts[lane], self.models["target"], _spec(case, self.models),
                                                 PROMPTS, MAX_TOKENS, **engine)
        return self.results[(lane, case)]


@pytest.fixture(scope="session")
def run_case(sim_v1_host, cpu_host, draft_models):
    """`run_case(lane, case)` -> `ascend_testkit.speculation.measure` of that engine."""
    return CaseRuns({SIMULATED: sim_v1_host, VLLM_CPU: cpu_host}, draft_models)
