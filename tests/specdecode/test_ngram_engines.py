"""N-gram speculative decoding in the simulated-NPU lane, on the V1 runner and on Model Runner V2.

``method="ngram"`` drafts tokens copied from the request's own history (no draft model). On V1 vLLM's `NgramProposer`
drafts on the host and `AscendRejectionSampler` verifies; on MRV2 `AscendNgramSpeculator` drafts with torch ops over
the runner's request states (upstream's speculator scans with Triton) and `AscendMRV2RejectionSampler` verifies.
The target is the tiny random Llama with attention (a rejected draft's KV must not leak into later tokens), the
prompts repeat n-grams and its greedy output falls into loops, so drafts are proposed, accepted and rejected. Each
engine's greedy tokens must equal vLLM's own CPU platform's without speculation (one engine per runner, the three
started together), and vLLM's spec-decode metrics must count exactly the drafts and accepted tokens that each
runner's n-gram rule (`expected_acceptance`, written here from upstream's definitions) yields on those tokens: a
drafter that matched the wrong n-gram, copied the wrong tokens or did not run changes the counts.
"""

from __future__ import annotations

import contextlib

import pytest

from ascend_specdecode.metrics import AcceptanceReport

pytestmark = pytest.mark.engine

K = 3
SPEC = {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
# Token ids (the word tokenizer's ids; 0-2 are special): a repeated trigram, a repeated 5-gram whose continuation in
# the prompt is not the model's (its first drafts are rejected), and no repetition at all.
PROMPTS = [[5, 6, 7] * 3 + [8, 9], [10, 20, 30, 40, 50] * 4, [100 + 7 * i for i in range(16)]]
MAX_TOKENS = 32
ENGINE = {"dtype": "float32", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4, "block_size": 32,
          "seed": 0}
MIN_N, MAX_N = SPEC["prompt_lookup_min"], SPEC["prompt_lookup_max"]
RUNNERS = {
    "v1": ("ascend_platform.worker.model_runner_v1.SimulatedModelRunnerV1", None,
           "ascend_specdecode.verification.AscendRejectionSampler"),
    "mrv2": ("ascend_platform.worker.model_runner_v2.SimulatedModelRunnerV2",
             "ascend_specdecode.speculators.ngram.AscendNgramSpeculator",
             "ascend_specdecode.mrv2_verification.AscendMRV2RejectionSampler"),
}


@pytest.fixture(scope="module")
def runs(cpu_host, host_pool, sim_host, tiny_model):
    """Greedy tokens of vLLM CPU without speculation ("baseline") and of n-gram engines on both runners, with their
    acceptance (vLLM's spec-decode metrics) and what the worker ran.

    The V1 engine runs in a host of its own, ended here: V1's `NgramProposer` JIT-compiles with numba, which loads
    llvmlite, whose `ffi.lib` answers any attribute (its `__dict__` too); vLLM 0.32's Triton dispatcher then fails
    the next engine start in that process when it scans every module's objects (`vars(value).get`), on vLLM's own
    CPU platform as on ours. One engine per process, as `vllm serve` runs, never meets it."""
    v1_host = host_pool.get("ngram-v1", lane="simulated", runner="v1")
    hosts = {"baseline": cpu_host, "v1": v1_host, "mrv2": sim_host}
    for name, host in hosts.items():
        spec = None if name == "baseline" else dict(SPEC)
        host.start(tiny_model, speculative_config=spec, disable_log_stats=False, wait=False, **ENGINE)
    out: dict[str, dict] = {}
    unanswered = list(hosts.values())
    try:
        while unanswered:
            unanswered[0].started()
            unanswered.pop(0)
        for name, host in hosts.items():
            host.metrics_mark()
            gen = host.generate(prompt_token_ids=PROMPTS, max_tokens=MAX_TOKENS, ignore_eos=True)
            out[name] = {"token_ids": [o["token_ids"] for o in gen["outputs"]]}
            if name != "baseline":
                out[name]["acceptance"] = AcceptanceReport.from_dict(host.acceptance(K))
                out[name]["usage"] = host.rpc("ascend_testkit.speculation:speculative_usage")[0]
    finally:
        for host in unanswered[1:]:  # a refused start leaves the later hosts' replies unread
            with contextlib.suppress(Exception):  # the first failure is the one reported
                host.started()
        for host in hosts.values():
            if host.engine is not None:
                host.stop()
        v1_host.close()
    return out


def _longest_match(ctx: list[int], rightmost: bool) -> int | None:
    """Where the tokens after the longest suffix n-gram (MIN_N..MAX_N) that occurs earlier start; None if none."""
    for n in range(MAX_N, MIN_N - 1, -1):
        starts = range(len(ctx) - n - 1, -1, -1) if rightmost else range(len(ctx) - n)
        for pos in starts:
            if ctx[pos:pos + n] == ctx[len(ctx) - n:]:
                return pos + n
    return None


def mrv2_drafts(ctx: list[int]) -> list[int]:
    """`NgramGPUSpeculator`: rightmost occurrence; always K tokens, the last token where nothing follows."""
    start = _longest_match(ctx, rightmost=True)
    return [ctx[start + j] if start is not None and start + j < len(ctx) else ctx[-1] for j in range(K)]


def v1_drafts(ctx: list[int]) -> list[int]:
    """`NgramProposer`: earliest occurrence of the longest n-gram; only the tokens that follow it (max_model_len is
    far off here)."""
    start = _longest_match(ctx, rightmost=False)
    return [] if start is None else ctx[start:start + K]


def expected_acceptance(draft_rule, outputs: list[list[int]]) -> AcceptanceReport:
    """Replay greedy decoding of `outputs` one request at a time: each step after the prefill verifies the drafts of
    the context so far, accepts their prefix that equals the next tokens, and emits the accepted tokens plus one."""
    drafts = draft_tokens = accepted = 0
    per_position = [0] * K
    for prompt, out in zip(PROMPTS, outputs, strict=True):
        ctx, i = [*prompt, out[0]], 1
        while i < len(out):
            draft = draft_rule(ctx)
            drafts, draft_tokens = drafts + bool(draft), draft_tokens + len(draft)
            a = 0
            while a < len(draft) and i + a < len(out) and draft[a] == out[i + a]:
                per_position[a] += 1
                a += 1
            accepted += a
            ctx += out[i:i + a + 1]
            i += a + 1
    return AcceptanceReport(num_drafts=drafts, num_draft_tokens=draft_tokens, num_accepted_tokens=accepted,
                            accepted_per_position=tuple(per_position))


DRAFT_RULES = {"v1": v1_drafts, "mrv2": mrv2_drafts}


def test_baseline_generates_every_token(runs):
    assert [len(t) for t in runs["baseline"]["token_ids"]] == [MAX_TOKENS] * len(PROMPTS)


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_ngram_is_lossless_against_vllm_cpu(runs, runner):
    assert runs[runner]["token_ids"] == runs["baseline"]["token_ids"], f"n-gram on {runner} changed greedy output"


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_ngram_drafts_are_accepted_and_rejected(runs, runner):
    report = runs[runner]["acceptance"]
    assert report.num_drafts > 0, f"{runner}: no n-gram drafts were verified"
    assert report.num_accepted_tokens > 0, (runner, report.as_dict())
    assert report.num_accepted_tokens < report.num_draft_tokens, (runner, report.as_dict())
    expected = expected_acceptance(DRAFT_RULES[runner], runs["baseline"]["token_ids"])
    assert report == expected, f"{runner}: vLLM counted {report}, the n-gram rule gives {expected}"


@pytest.mark.parametrize("runner", sorted(RUNNERS))
def test_our_drafter_and_verifier_ran(runs, runner):
    """The Ascend verifier decided every greedy verification through `ascend_kernels`; on MRV2 our speculator
    drafted (upstream's would launch Triton scans)."""
    usage = runs[runner]["usage"]
    runner_cls, speculator, verifier = RUNNERS[runner]
    assert usage["runner"] == runner_cls, usage
    assert usage["verifier"] == verifier, usage
    verified = usage["verifier_counts"]
    assert verified.get("greedy_verifications", 0) > 0 and verified.get("upstream_verifications", 0) == 0, usage
    if speculator is None:  # V1 keeps vLLM's host-side n-gram proposer
        assert usage["speculator"] == "vllm.v1.spec_decode.ngram_proposer.NgramProposer", usage
    else:
        assert usage["speculator"] == speculator, usage
        counts = usage["speculator_counts"]
        assert counts.get("ngram_scans", 0) > 0 and counts["ngram_scans"] == counts.get("propose", 0), counts
