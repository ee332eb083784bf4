"""Greedy requests with each deterministic knob (penalties, logit bias, bad words, allowed tokens, min tokens),
prompt logprobs and max_logprobs: token for token what plain vLLM CPU gives, on both runners of the simulated lane.

No noise is drawn here, so nothing may differ but float rounding: tokens must be equal, logprobs close. Each knob is
also held to its own effect (the output changes, a banned token never appears), so an ignored knob cannot pass.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

pytestmark = pytest.mark.engine
OURS = ("v1", "mrv2")
# Float32 through a model whose weights are drawn wide (clear-cut choices, large activations): on the 210-token
# chunked prompt each engine's logprobs are within 1e-3 of a float64 transformers forward (plain vLLM CPU 9.4e-4,
# ours 6.9e-4, measured), so the two float32 engines may differ by up to twice that; they differed by 8.1e-4 at most.
# A wrong mask, position or chunk boundary moves logprobs by tenths or more.
LOGPROB_TOL = 2e-3


def _by_id(rows):
    return {r["id"]: r for r in rows}


@pytest.mark.parametrize("lane", OURS)
def test_greedy_matches_vllm_cpu(served, lane):
    ours, cpu = served[lane]["greedy"], served["cpu"]["greedy"]
    check_logprobs_close(ours, cpu, name_0=lane, name_1="vllm-cpu")
    assert [o["token_ids"] for o in ours] == [o["token_ids"] for o in cpu]


@pytest.mark.parametrize("lane", OURS)
def test_each_knob_gives_vllm_cpus_tokens(served, lane):
    ours, cpu = _by_id(served[lane]["knobs"]), _by_id(served["cpu"]["knobs"])
    assert set(ours) == set(cpu) and len(cpu) == 9
    assert {k: o["token_ids"] for k, o in ours.items()} == {k: o["token_ids"] for k, o in cpu.items()}


def test_each_knob_acts(served):
    """On plain vLLM CPU's outputs (equal to ours by the test above): every knob changed the greedy output, and in
    the way it should."""
    plan = served.plan
    knobs = {k: o["token_ids"] for k, o in _by_id(served["cpu"]["knobs"]).items()}
    none = knobs["none"]
    assert none == plan.baseline and len(none) == 24
    for knob in ("repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias", "bad_words",
                 "allowed_token_ids"):
        assert knobs[knob] != none, knob
    assert plan.banned not in knobs["logit_bias"] and plan.boosted in knobs["logit_bias"]
    pair, single = ([served.tok.convert_tokens_to_ids(c) for c in word] for word in plan.bad_words)
    out = knobs["bad_words"]
    assert single[0] not in out and not any(out[i : i + 2] == pair for i in range(len(out) - 1))
    assert set(knobs["allowed_token_ids"]) <= set(plan.allowed)
    # EOS at +30: alone the request stops at its first token; min_tokens=5 holds it back for five tokens.
    assert knobs["eos_bias"] == [2]
    assert len(knobs["min_tokens"]) == 6 and knobs["min_tokens"][-1] == 2 and 2 not in knobs["min_tokens"][:5]


@pytest.mark.parametrize("lane", OURS)
def test_prompt_logprobs_match_vllm_cpu(served, lane, workload):
    """Prompt logprobs (top 5 and the prompt's own token) of short, block-crossing and chunked prompts (the last
    is prefilled in two chunks under the 128-token budget): the rule of check_logprobs_close over each position's
    most likely token, and every logprob within LOGPROB_TOL."""
    ours, cpu = served[lane]["prompt_logprobs"], served["cpu"]["prompt_logprobs"]
    assert [len(o["prompt_token_ids"]) for o in cpu] == [len(p) for p in workload.PROMPT_LOGPROB_PROMPTS]
    assert max(len(p) for p in workload.PROMPT_LOGPROB_PROMPTS) > workload.TOKEN_BUDGET
    for o, c in zip(ours, cpu, strict=True):
        assert o["prompt_token_ids"] == c["prompt_token_ids"]
        assert o["prompt_logprobs"][0] is None and c["prompt_logprobs"][0] is None
        positions = range(1, len(c["prompt_token_ids"]))
        assert all(len(c["prompt_logprobs"][i]) >= 5 for i in positions)
        as_rows = [{"token_ids": [int(max(side["prompt_logprobs"][i], key=side["prompt_logprobs"][i].get))
                                  for i in positions],
                    "logprobs": [side["prompt_logprobs"][i] for i in positions]} for side in (o, c)]
        check_logprobs_close([as_rows[0]], [as_rows[1]], name_0=lane, name_1="vllm-cpu")
        for i in positions:
            mine, theirs = o["prompt_logprobs"][i], c["prompt_logprobs"][i]
            assert set(mine) == set(theirs), (i, mine, theirs)
            assert max(abs(mine[t] - theirs[t]) for t in theirs) < LOGPROB_TOL, (i, mine, theirs)
    check_logprobs_close(ours, cpu, name_0=lane, name_1="vllm-cpu")


@pytest.mark.parametrize("lane", OURS)
def test_max_logprobs_is_the_limit(served, lane, workload):
    """At max_logprobs (here the whole vocabulary) every token's logprob comes back, sampled and prompt, equal to
    plain vLLM CPU's, and so do explicitly chosen token ids' (logprob_token_ids); one more than max_logprobs is
    refused with vLLM's own message."""
    ours, cpu = served[lane]["max_logprobs"], served["cpu"]["max_logprobs"]
    vocab = workload.VOCAB_SIZE
    for o, c in zip(ours["full"], cpu["full"], strict=True):
        assert o["token_ids"] == c["token_ids"]
        for mine, theirs in [*zip(o["logprobs"], c["logprobs"], strict=True),
                             *zip(o["prompt_logprobs"][1:], c["prompt_logprobs"][1:], strict=True)]:
            assert len(mine) == len(theirs) == vocab
            assert max(abs(mine[t] - theirs[t]) for t in theirs) < LOGPROB_TOL
    # logprob_token_ids: the sampled token's logprob and those of the chosen ids, at every step.
    for o, c in zip(ours["chosen"], cpu["chosen"], strict=True):
        assert o["token_ids"] == c["token_ids"]
        for token, mine, theirs in zip(o["token_ids"], o["logprobs"], c["logprobs"], strict=True):
            assert set(mine) == set(theirs) == {str(t) for t in (token, *workload.LOGPROB_TOKEN_IDS)}
            assert max(abs(mine[t] - theirs[t]) for t in theirs) < LOGPROB_TOL
    for key, message in ours["refused"].items():
        assert message is not None and cpu["refused"][key] is not None, key
        expected = f"Requested {'sample' if key == 'logprobs' else 'prompt'} logprobs of {vocab + 1}, which is " \
                   f"greater than max allowed: {vocab}"
        assert expected in message and expected in cpu["refused"][key], (message, cpu["refused"][key])
