"""Engine-level speculative-decoding tests: shared models and the engines of both runners, started once per session.

Model Runner V2 (`sim_host`, the simulated lane's default runner) runs every method through the Ascend speculators
and verifier (`MRV2Runs`, cases from `ascend_testkit.speculation.MRV2_CASES`): EAGLE, MTP, DFlash, DFlash2 and
DSpark, each against a no-speculation baseline of its target, as one batch of mixed prompt lengths around the KV
block boundary. The V1 runner (`sim_v1_host`) keeps what only V1 runs here (`draft_model`) and EAGLE/DFlash with the
Ascend V1 verifier; vLLM's own CPU platform (``SpecDecodeCPUWorker``) runs one engine, an EAGLE self-draft. Engines
run on the session's shared hosts (tests/conftest.py), one after another.
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
# Model Runner V2: one batch of mixed lengths around the 32-token block boundary (prompts end one before, at and one
# past it; the short one crosses it while generating), each method against its target's baseline.
MRV2_PROMPT_LENGTHS = (9, 31, 32, 33)
MRV2_PROMPTS = [prompt_of_length(n, offset=37 * i) for i, n in enumerate(MRV2_PROMPT_LENGTHS)]
MRV2_MAX_TOKENS = 28


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
            self.results[(lane, case)] = measure(
                self.hosts[lane], self.models["target"], _spec(case, self.models), PROMPTS, MAX_TOKENS, **engine
            )
        return self.results[(lane, case)]


@pytest.fixture(scope="session")
def run_case(sim_v1_host, cpu_host, draft_models):
    """`run_case(lane, case)` -> `ascend_testkit.speculation.measure` of that engine."""
    return CaseRuns({SIMULATED: sim_v1_host, VLLM_CPU: cpu_host}, draft_models)


class MRV2Runs:
    """Each `MRV2_CASES` engine on the Model Runner V2 host, run once on first use (`measure` of one batch)."""

    def __init__(self, host, models: dict[str, dict]) -> None:
        self.host, self.models = host, models
        self.results: dict[str, dict] = {}

    def __call__(self, case: str) -> dict:
        if case not in self.results:
            from ascend_testkit.speculation import measure

            m = self.models[case]
            self.results[case] = measure(
                self.host,
                m["model"],
                m["spec"],
                MRV2_PROMPTS,
                MRV2_MAX_TOKENS,
                sequential=False,
                **ENGINE_KWARGS,
                **m["engine"],
            )
        return self.results[case]


@pytest.fixture(scope="session")
def mrv2_workload() -> dict:
    """What every `run_mrv2` case generates: one batch of MRV2_PROMPTS, MRV2_MAX_TOKENS each."""
    return {"prompts": MRV2_PROMPTS, "max_tokens": MRV2_MAX_TOKENS}


@pytest.fixture(scope="session")
def engine_kwargs() -> dict:
    """The LLM arguments every engine of these suites uses."""
    return dict(ENGINE_KWARGS)


@pytest.fixture(scope="session")
def mrv2_models(specdecode_cache) -> dict[str, dict]:
    from ascend_testkit.speculation import mrv2_case_models

    return mrv2_case_models(specdecode_cache, K)


@pytest.fixture(scope="session")
def run_mrv2(sim_host, mrv2_models):
    """`run_mrv2(case)` -> `ascend_testkit.speculation.measure` of that Model Runner V2 engine."""
    return MRV2Runs(sim_host, mrv2_models)
