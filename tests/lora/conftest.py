"""The LoRA suite's engines: the tiny Llama with two tiny PEFT adapters (`ascend_testkit.models.lora_adapter`),
served on plain vLLM CPU ("cpu", V1, no plugin: the anchor) and on ours in the simulated lane with the V1 runner
("v1") and with Model Runner V2 ("v2", the lane's default). The hosts are the session's shared ones.

Each engine starts once (`lora_runs[name]`) and serves, each in a batch of its own, the prompts with no adapter, with
adapter 1 and with adapter 2; ours also serve one mixed batch (adapter 1's prompts beside adapter 2's and the base
model's), and report what their generation ran (the platform's usage counters: the punica steps on our LoRA ops),
with the kernel facade's argument checks on. Plain vLLM CPU serves no mixed batch: the tests anchor every adapter on
plain vLLM serving it alone (its base requests beside adapter requests get the last slot's adapter).
"""

from __future__ import annotations

import pytest

from ascend_testkit.counters import counter_delta
from ascend_testkit.engine_runs import EngineRuns

PROMPT_LENGTHS = (5, 17, 90)  # the 90-token prompt is prefilled in two chunks (budget 64)
MAX_TOKENS = 10
ENGINE = dict(
    dtype="float32",
    max_model_len=256,
    enforce_eager=True,
    max_num_seqs=8,
    seed=0,
    max_num_batched_tokens=64,
    enable_chunked_prefill=True,
    enable_prefix_caching=False,
    enable_lora=True,
    max_loras=2,
    max_lora_rank=8,
)
ADAPTER_SEEDS = {"a1": 1, "a2": 2}
OURS = {"additional_config": {"kernel_checks": True}}


@pytest.fixture(scope="session")
def lora_adapters(cache_root, model_dir) -> dict[str, dict]:
    """{"a1": {name, id, path}, "a2": ...}: what `host.generate(lora=...)` takes."""
    from ascend_testkit.models.lora_adapter import LoraSpec, cached_lora_adapter

    return {
        name: {
            "name": name,
            "id": i + 1,
            "path": str(cached_lora_adapter(LoraSpec(seed=seed), cache_root / "models", model_dir)),
        }
        for i, (name, seed) in enumerate(ADAPTER_SEEDS.items())
    }


@pytest.fixture(scope="session")
def lora_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


class LoraRuns(EngineRuns):
    def __init__(self, hosts, model, adapters, prompts) -> None:
        super().__init__()
        self.hosts, self.model, self.adapters, self.prompts = hosts, model, adapters, prompts

    def _run(self, name: str) -> dict:
        host = self.hosts(name)
        host.start(self.model, **(ENGINE if name == "cpu" else ENGINE | OURS))
        try:
            before = host.usage()[0]["counts"] if name != "cpu" else {}

            def generate(lora) -> list[dict]:
                return host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=5, lora=lora)["outputs"]

            result = {"base": generate(None), **{a: generate(spec) for a, spec in self.adapters.items()}}
            if name != "cpu":
                n = len(self.prompts)
                mixed = host.generate(
                    self.prompts * 3,
                    max_tokens=MAX_TOKENS,
                    logprobs=5,
                    lora=[self.adapters["a1"]] * n + [self.adapters["a2"]] * n + [None] * n,
                )
                mixed = mixed["outputs"]
                result["mixed"] = {"a1": mixed[:n], "a2": mixed[n : 2 * n], "base": mixed[2 * n :]}
                after = host.usage()[0]["counts"]
                result["counts"] = counter_delta(after, before)
        finally:
            host.stop()
        return result


@pytest.fixture(scope="module")
def lora_runs(request, model_dir, lora_adapters, lora_prompts) -> LoraRuns:
    # The session's shared hosts (tests/conftest.py); sim_host skips where MRV2 is refused, asked for only by v2 runs.
    fixtures = {"cpu": "cpu_host", "v1": "sim_v1_host", "v2": "sim_host"}
    return LoraRuns(lambda name: request.getfixturevalue(fixtures[name]), model_dir, lora_adapters, lora_prompts)
