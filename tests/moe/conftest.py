"""The MoE suite's engines: vLLM's own CPU platform (the reference) and ours in the simulated-NPU lane.

`moe_runs` runs each engine once per session and keeps what it saw: outputs with top-5 logprobs, our usage markers
(counted over the engine's generation only: a single-rank worker lives in its host process, which keeps counting
across engines), probe results. Our single-rank engines run on the shared hosts: Qwen3-MoE, the scaled-experts model
(registered in that host process by a probe of the Qwen3-MoE engine) and GLM-4-MoE on the V1 host, DeepSeek and
Cohere2-MoE on the MRV2 one; two-rank engines (tensor / expert parallel, gloo) on "sim-2ranks" (MRV2, the simulated
lane's default runner), its two workers pinned to one core each.
Models: a tiny Qwen3-MoE whose routing is skewed towards the experts of one expert-parallel rank, the same weights
for the scaled-experts model, a tiny GLM-4-MoE (DeepSeek-V3 routing with a shared expert, standard attention), a
tiny DeepSeek-V2 MoE (MLA, grouped top-k, a shared expert), a tiny Cohere2-MoE (the model's own custom routing
function: sigmoid top-k, renormalised); the tiny Llama for batch-sharded sampling.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close

BLOCK_SIZE = 32
PROMPT_LENGTHS = (5, 31, 33, 70)  # inside a block, at and across block edges, chunked (64-token budget)
MAX_TOKENS = 16
ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, block_size=BLOCK_SIZE,
              max_num_batched_tokens=64, enable_prefix_caching=False, seed=0)
ROUTE_SKEW = 2.0
# Steps between automatic EPLB rebalances: above one generate of the prompts (~18 steps), below two.
EPLB_INTERVAL = 30
EPLB = {"eplb": True, "eplb_redundant_experts": 2, "eplb_interval": EPLB_INTERVAL}
PROBES = "ascend_testkit.moe_probes:"
# DeepSeek's MLA engines as the MLA suite runs them (tests/mla): 16-token blocks, chunked prefill; the reference
# with vLLM's native rotary (vLLM-CPU's rotary kernel mis-rotates MLA's 3-D queries) and vLLM's reference CPU_MLA
# backend, named (on hosts with AMX tiles vLLM would pick AMX_MLA, which takes bf16 only).
MLA_OURS = dict(block_size=16, max_num_batched_tokens=32)
MLA_REFERENCE = dict(block_size=None, max_num_batched_tokens=None, enable_chunked_prefill=None,
                     compilation_config={"custom_ops": ["none", "-rotary_embedding"]}, attention_backend="CPU_MLA")


@pytest.fixture(scope="session")
def moe_models(cache_root) -> dict[str, str]:
    from ascend_testkit.models.deepseek import TinyDeepseekSpec, cached_tiny_deepseek
    from ascend_testkit.models.moe import (
        TinyMoeSpec,
        cached_scaled_experts_moe,
        cached_tiny_cohere2_moe,
        cached_tiny_glm_moe,
        cached_tiny_qwen3_moe,
    )

    spec = TinyMoeSpec(route_skew=ROUTE_SKEW)
    deepseek = TinyDeepseekSpec(num_layers=3, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2,
                                n_group=4, topk_group=2, first_k_dense_replace=1, routed_scaling_factor=2.5)
    folder = cache_root / "models"
    return {"qwen3": str(cached_tiny_qwen3_moe(spec, folder)), "scaled": str(cached_scaled_experts_moe(spec, folder)),
            "glm": str(cached_tiny_glm_moe(cache_dir=folder)), "deepseek": str(cached_tiny_deepseek(deepseek, folder)),
            "cohere": str(cached_tiny_cohere2_moe(cache_dir=folder))}


@pytest.fixture(scope="session")
def moe_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def _generate(host, prompts) -> dict:
    return host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=5)


def _delta(after: list[dict], before: list[dict]) -> list[dict]:
    """Each rank's usage counts of what ran between two reports (facts as of the later one)."""
    out = []
    for now, then in zip(after, before, strict=True):
        counts = {k: v - then["counts"].get(k, 0) for k, v in now["counts"].items()}
        out.append({"counts": {k: v for k, v in counts.items() if v}, "facts": now["facts"]})
    return out


class MoeRuns:
    """Each engine of the suite, run on first use and remembered for the session."""

    def __init__(self, pool, cpu_host, sim_v1_host, sim_host, models, prompts, llama) -> None:
        self.pool, self.cpu, self.sim, self.mrv2, self.models, self.prompts, self.llama = (
            pool, cpu_host, sim_v1_host, sim_host, models, prompts, llama)
        self.results: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = getattr(self, f"_run_{name}")()
        return self.results[name]

    @property
    def sim2(self):
        return self.pool.get("sim-2ranks", lane="simulated", runner="v2", cpus="0|1")

    def _run(self, host, model, *, probes=(), **engine) -> dict:
        started = host.start(model, **{k: v for k, v in (ENGINE | engine).items() if v is not None})
        try:
            ours = host.lane == "simulated"
            before = host.usage() if ours else None
            result = {"startup_s": started["startup_s"], "outputs": _generate(host, self.prompts)["outputs"]}
            if ours:
                result["usage"] = _delta(host.usage(), before)
            for probe in probes:
                result[probe] = host.rpc(PROBES + probe)
        finally:
            host.stop()
        return result

    def _run_cpu_qwen3(self) -> dict:
        return self._run(self.cpu, self.models["qwen3"])

    def _run_qwen3(self) -> dict:
        return self._run(self.sim, self.models["qwen3"], probes=("routed_experts", "register_scaled_experts"),
                         additional_config={"kernel_checks": True})

    def _run_scaled(self) -> dict:
        self["qwen3"]  # its engine registered the scaled-experts model in the host process
        return self._run(self.sim, self.models["scaled"], probes=("routed_experts",))

    def _run_cpu_glm(self) -> dict:
        return self._run(self.cpu, self.models["glm"])

    def _run_glm(self) -> dict:
        return self._run(self.sim, self.models["glm"], probes=("routed_experts",))

    def _run_cpu_deepseek(self) -> dict:
        return self._run(self.cpu, self.models["deepseek"], **MLA_REFERENCE)

    def _run_deepseek(self) -> dict:
        return self._run(self.mrv2, self.models["deepseek"], probes=("routed_experts",), **MLA_OURS,
                         additional_config={"kernel_checks": True})

    def _run_cpu_cohere(self) -> dict:
        return self._run(self.cpu, self.models["cohere"])

    def _run_cohere(self) -> dict:
        return self._run(self.mrv2, self.models["cohere"], probes=("routed_experts",))

    def _run_expert_parallel(self) -> dict:
        """Experts split over two EP ranks with EPLB: generate (A), again across an automatic rebalance (B), then
        on the new placement (C); the load window before and after."""
        host = self.sim2
        host.start(self.models["qwen3"], tensor_parallel_size=2, enable_expert_parallel=True,
                   **(ENGINE | {"additional_config": EPLB}))
        try:
            before = host.usage()
            out: dict = {"A": _generate(host, self.prompts)["outputs"]}
            out["state_A"] = host.rpc(PROBES + "eplb_state")
            out["window_A"] = host.rpc(PROBES + "eplb_window")
            out["B"] = _generate(host, self.prompts)["outputs"]
            out["state_B"] = host.rpc(PROBES + "eplb_state")
            host.rpc(PROBES + "eplb_reset")
            out["C"] = _generate(host, self.prompts)["outputs"]
            out["window_C"] = host.rpc(PROBES + "eplb_window")
            out["state_C"] = host.rpc(PROBES + "eplb_state")
            out["usage"] = _delta(host.usage(), before)
        finally:
            host.stop()
        return out

    def _run_expert_parallel_without_eplb(self) -> dict:
        """Experts split over two EP ranks by vLLM's own expert map (no EPLB placement of ours)."""
        return self._run(self.sim2, self.models["qwen3"], tensor_parallel_size=2, enable_expert_parallel=True)

    def _run_cpu_llama(self) -> dict:
        return self._run(self.cpu, self.llama)

    def _run_tp2_batch_sharded(self) -> dict:
        return self._run(self.sim2, self.llama, tensor_parallel_size=2, enable_batch_sharded_sampling=True)


@pytest.fixture(scope="session")
def moe_runs(host_pool, cpu_host, sim_v1_host, sim_host, moe_models, moe_prompts, tiny_model) -> MoeRuns:
    return MoeRuns(host_pool, cpu_host, sim_v1_host, sim_host, moe_models, moe_prompts, str(tiny_model))


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
