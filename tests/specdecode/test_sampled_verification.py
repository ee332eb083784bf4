"""Speculative sampling (temperature 1) through the Ascend rejection sampler keeps the target's distribution.

On each runner of the simulated lane (V1: `AscendRejectionSampler`, MRV2: `AscendMRV2RejectionSampler`), DRAWS seeded
requests of one prompt go to an engine without speculation and DRAWS others (disjoint seeds) to an engine with a
noisy EAGLE self-draft (acceptance strictly between 0 and 1: drafts are accepted, rejected and replaced by draws
from the residual). The first generated token comes from the prefill, the next ones from verification: at every
later position the two engines' token distributions must agree (Pearson's two-sample chi-square, p > ALPHA), over
at least three categories (a verifier that accepted every draft would emit the draft's choice far more often than
the target samples it; before `verification.apply_sampling_constraints`, V1's tokens collapsed to id 0 here and this
test failed with p ~ 1e-73). The verifiers must have
decided every verification with `ascend_kernels` (usage counters), seeded requests with their own generators, and a
seeded request must repeat its tokens in another batch.
"""

from __future__ import annotations

import pytest

from ascend_specdecode.metrics import AcceptanceReport
from ascend_testkit.sampling_stats import homogeneity

pytestmark = pytest.mark.engine

K = 3
DRAWS = 240
MAX_TOKENS = 1 + K  # the prefill's token, then K tokens that verification decides
ALPHA = 1e-3
ENGINE = {
    "dtype": "float32",
    "max_model_len": 128,
    "enforce_eager": True,
    "max_num_seqs": 48,
    "block_size": 32,
    "seed": 0,
}
VERIFIERS = {
    "v1": "ascend_specdecode.verification.AscendRejectionSampler",
    "mrv2": "ascend_specdecode.mrv2_verification.AscendMRV2RejectionSampler",
}
REPEATED = 4  # seeded requests run again in a batch of their own


def _requests(prompt: str, seeds: range, tag: str = "s") -> list[dict]:
    return [
        {
            "id": f"{tag}{seed}",
            "prompt": prompt,
            "max_tokens": MAX_TOKENS,
            "sampling": {"temperature": 1.0, "seed": seed},
        }
        for seed in seeds
    ]


@pytest.fixture(scope="module")
def models(specdecode_cache) -> dict:
    from ascend_testkit.speculation import CASES_BY_NAME, mrv2_case_models

    return mrv2_case_models(specdecode_cache, K, [CASES_BY_NAME["baseline-llama"], CASES_BY_NAME["eagle-noisy"]])


@pytest.fixture(scope="module")
def runs(sim_v1_host, sim_host, models) -> dict:
    """Per runner: the baseline's and the speculative engine's tokens, the speculative engine's acceptance and usage,
    and the repeat of a few seeded requests. Both runners' engines start side by side."""
    from ascend_testkit.models.tiny_llama import prompt_of_length

    prompt = prompt_of_length(12, offset=5)
    hosts = {"v1": sim_v1_host, "mrv2": sim_host}
    out: dict[str, dict] = {name: {} for name in hosts}
    for case, seeds in (("baseline-llama", range(DRAWS)), ("eagle-noisy", range(DRAWS, 2 * DRAWS))):
        m = models[case]
        for host in hosts.values():
            host.start(
                m["model"], speculative_config=m["spec"], disable_log_stats=False, wait=False, **ENGINE, **m["engine"]
            )
        for host in hosts.values():
            host.started()
        try:
            for name, host in hosts.items():
                host.metrics_mark()
                done = host.run_requests(_requests(prompt, seeds), timeout=300)
                out[name][case] = [r["token_ids"] for r in done]
                if m["spec"] is not None:
                    out[name]["acceptance"] = AcceptanceReport.from_dict(host.acceptance(K))
                    out[name]["usage"] = host.rpc("ascend_testkit.speculation:speculative_usage")[0]
                    again = host.run_requests(_requests(prompt, seeds[:REPEATED], tag="again"), timeout=120)
                    out[name]["repeated"] = [r["token_ids"] for r in again]
        finally:
            for host in hosts.values():
                host.stop()
    return out


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_noisy_draft_is_accepted_in_part(runs, runner):
    report = runs[runner]["acceptance"]
    assert report.num_drafts > 0, f"{runner}: no drafts were verified"
    assert 0 < report.num_accepted_tokens < report.num_draft_tokens, (runner, report.as_dict())


@pytest.mark.parametrize("position", range(1, MAX_TOKENS))
@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_speculative_sampling_keeps_the_target_distribution(runs, runner, position):
    plain = [t[position] for t in runs[runner]["baseline-llama"]]
    spec = [t[position] for t in runs[runner]["eagle-noisy"]]
    assert len(plain) == len(spec) == DRAWS
    test = homogeneity(plain, spec)
    assert test.categories >= 3, (runner, position, test)  # a spread-out distribution, not one certain token
    assert test.p_value > ALPHA, (runner, position, test.as_dict())


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_our_verifier_decided_the_sampled_batches(runs, runner):
    usage = runs[runner]["usage"]
    assert usage["verifier"] == VERIFIERS[runner], usage
    counts = usage["verifier_counts"]
    assert counts.get("sampled_verifications", 0) > 0, counts
    assert counts.get("upstream_verifications", 0) == 0, counts
    assert counts.get("seeded_rows", 0) >= DRAWS, counts  # every request carried a seed: its own generator


@pytest.mark.parametrize("runner", sorted(VERIFIERS))
def test_seeded_requests_repeat_in_another_batch(runs, runner):
    assert runs[runner]["repeated"] == runs[runner]["eagle-noisy"][:REPEATED]
