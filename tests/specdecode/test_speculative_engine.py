"""Speculative decoding on vLLM's V1 model runner: a draft equal to the target is always accepted, any is lossless.

The target is a tiny random Llama with peaked output distributions (greedy choices are not decided by rounding),
made EAGLE-compatible (ascend_testkit.models.drafts). Floors are per draft position, vLLM's convention (accepted at
position i over all drafts), so a drop at any single position fails the test by name. V1 is the runner of
`draft_model` here and of the release lane; Model Runner V2 is test_mrv2_speculation.py. vLLM's own CPU platform
runs the EAGLE self-draft (see conftest).
"""

from __future__ import annotations

import pytest

from ascend_specdecode.metrics import AcceptanceBelowFloor, AcceptanceReport

pytestmark = pytest.mark.engine

SIMULATED, VLLM_CPU, BASELINE = "simulated-npu", "vllm-cpu", "baseline"  # lanes and cases of conftest.LANE_CASES
SELF_DRAFT_FLOOR = 0.99
# Methods whose draft can carry exactly the target's computation (see the report for the others).
SELF_DRAFT_METHODS = ["draft_model", "eagle"]
RANDOM_DRAFT_METHODS = ["draft_model", "eagle", "dflash"]
ASCEND_VERIFIER = "ascend_specdecode.verification.AscendRejectionSampler"
SELF_DRAFT_RUNS = [(SIMULATED, m) for m in SELF_DRAFT_METHODS] + [(VLLM_CPU, "eagle")]
SPECULATIVE_RUNS = ([(SIMULATED, f"{m}-self") for m in SELF_DRAFT_METHODS]
                    + [(SIMULATED, f"{m}-random") for m in RANDOM_DRAFT_METHODS] + [(VLLM_CPU, "eagle-self")])


def report_of(result: dict) -> AcceptanceReport:
    return AcceptanceReport.from_dict(result["acceptance"])


@pytest.fixture(scope="module")
def baseline(run_case, workload):
    result = run_case(SIMULATED, BASELINE)
    assert [len(t) for t in result["token_ids"]] == [workload["max_tokens"]] * len(workload["prompts"])
    return result


@pytest.mark.parametrize(("lane", "method"), SELF_DRAFT_RUNS)
def test_self_draft_is_accepted_at_every_position(run_case, baseline, workload, lane, method):
    result = run_case(lane, f"{method}-self")
    report = report_of(result)
    assert len(report.acceptance_per_position) == workload["k"]
    report.check_floor(SELF_DRAFT_FLOOR, label=f"{method} self-draft, {lane} lane")
    # vLLM's CPU lane has no baseline engine of its own: the simulated lane's stands in (the platform e2e tests
    # show both lanes generate the same greedy tokens on peaked models).
    assert result["token_ids"] == baseline["token_ids"], f"{method} self-draft, {lane} lane: output changed"


@pytest.mark.parametrize("method", RANDOM_DRAFT_METHODS)
def test_random_draft_is_lossless(run_case, baseline, method):
    result = run_case(SIMULATED, f"{method}-random")
    report = report_of(result)
    assert report.num_drafts > 0, f"{method}: no drafts were verified"
    # A random draft must be mostly rejected: acceptance that stays high here would mean the metric lies.
    assert report.acceptance_per_position[0] < 0.5, report.as_dict()
    assert result["token_ids"] == baseline["token_ids"], f"{method}: speculation changed greedy output"


def test_floor_check_fails_on_a_dropped_position(run_case):
    """The floor the self-draft tests hold names the position that fell, on real engine metrics."""
    report = report_of(run_case(SIMULATED, "draft_model-random"))
    with pytest.raises(AcceptanceBelowFloor, match=r"position 0: 0\.\d+ < 0\.990"):
        report.check_floor(SELF_DRAFT_FLOOR, label="random draft")


@pytest.mark.parametrize(("lane", "case"), SPECULATIVE_RUNS)
def test_drafts_are_verified_by_the_ascend_verifier(run_case, lane, case):
    """The simulated lane's platform worker installs it (install_speculative_decoding); so does our CPU worker."""
    parts = run_case(lane, case)["parts"]
    assert parts["verifier"] == ASCEND_VERIFIER, (lane, case, parts)
    assert parts["drafter"] is not None, (lane, case, parts)
    if lane == SIMULATED:
        assert parts["runner"] == "ascend_platform.worker.model_runner_v1.SimulatedModelRunnerV1", parts
