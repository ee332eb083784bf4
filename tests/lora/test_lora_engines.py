"""LoRA in the simulated-NPU lane, on the V1 runner and on Model Runner V2: two PEFT adapters on the tiny Llama.

* each adapter served in a batch of its own gives plain vLLM CPU's greedy tokens for that adapter, also served alone
  (token-equal, or at the first divergence each side's token in the other's top-5);
* a mixed batch (adapter 1's prompts beside adapter 2's) gives each request its adapter's tokens from the per-adapter
  batches: punica's per-token adapter mapping, not one adapter for the whole batch;
* the adapters change the output: a run that ignored LoRA (or applied one adapter for the other) fails here;
* base-model requests in that mixed batch give the base model's tokens from its batch of its own (a token without an
  adapter gets no LoRA term), which plain vLLM CPU 0.32 does not (its torch ops give them the last slot's adapter);
* the LoRA terms ran on our punica wrapper's steps (`ascend_platform.ops.punica`: ascend_kernels' sgmv ops for
  prefill, bgmv for decode), counted by the platform's usage counters.

Before the fix both runners failed at the first step: vLLM's `LogitsProcessorWithLoRA.forward` runs the base layer's
`forward` with itself as `self`, and our `AscendLogitsProcessor.forward` called `super()` (a TypeError there).
Plain vLLM CPU 0.32 gives base requests batched beside adapter requests wrong tokens itself, so a base request inside
a mixed batch is anchored on our own base-only batch (itself anchored on plain vLLM CPU's).
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

RUNNERS = ("v1", "v2")
ADAPTERS = ("a1", "a2")


def _tokens(outputs: list[dict]) -> list[list[int]]:
    return [o["token_ids"] for o in outputs]


@pytest.mark.parametrize("runner", RUNNERS)
def test_each_adapter_alone_matches_plain_vllm_cpu(lora_runs, runner):
    ours, cpu = lora_runs[(runner,)], lora_runs[("cpu",)]
    for adapter in ("base", *ADAPTERS):
        check_logprobs_close(ours[adapter], cpu[adapter], name_0=f"{runner} {adapter}", name_1=f"cpu {adapter}")


@pytest.mark.parametrize("runner", RUNNERS)
def test_mixed_batch_matches_each_adapter_alone(lora_runs, runner):
    ours = lora_runs[(runner,)]
    for adapter in ADAPTERS:
        check_logprobs_close(
            ours["mixed"][adapter],
            ours[adapter],
            name_0=f"{runner} {adapter} in the mixed batch",
            name_1=f"{runner} {adapter} alone",
        )


@pytest.mark.parametrize("runner", RUNNERS)
def test_adapters_change_the_output(lora_runs, runner):
    ours = lora_runs[(runner,)]
    base, a1, a2 = (_tokens(ours[k]) for k in ("base", *ADAPTERS))
    for i in range(len(base)):
        assert len({tuple(base[i]), tuple(a1[i]), tuple(a2[i])}) == 3, (
            f"prompt {i}: base {base[i]}, a1 {a1[i]}, a2 {a2[i]} are not all different"
        )
    mixed = ours["mixed"]
    assert _tokens(mixed["a1"]) != _tokens(mixed["a2"])


@pytest.mark.parametrize("runner", RUNNERS)
def test_base_requests_beside_adapters_get_no_lora_term(lora_runs, runner):
    ours = lora_runs[(runner,)]
    check_logprobs_close(
        ours["mixed"]["base"], ours["base"], name_0=f"{runner} base in the mixed batch", name_1=f"{runner} base alone"
    )


@pytest.mark.parametrize("runner", RUNNERS)
def test_lora_terms_ran_on_our_punica_ops(lora_runs, runner):
    counts = lora_runs[(runner,)]["counts"]
    steps = ("kernels.sgmv_shrink", "kernels.sgmv_expand", "kernels.bgmv_shrink", "kernels.bgmv_expand")
    missing = [step for step in steps if not counts.get(step)]
    assert not missing, f"{runner}: punica steps that never ran on our ops: {missing} (counts: {counts})"
