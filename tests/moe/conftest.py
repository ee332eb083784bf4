"""The MoE suite's engines: vLLM's own CPU platform (the reference) and ours in the simulated-NPU lane.

`moe_runs` runs each engine once per session and keeps what it saw (outputs with top-5 logprobs, our usage markers,
probe results). Single-rank engines of ours run on the "sim-moe" host, two-rank engines (tensor / expert parallel,
gloo) on "sim-2ranks", its two workers pinned to one core each; both hosts start with `moe_probes.host_setup`
(the scaled-experts test model registered, the platform resolved so V1 and V2 engines run in any order).
Models: a tiny Qwen3-MoE whose routing is skewed towards the experts of one expert-parallel rank, the same weights
for the scaled-experts model, and a tiny GLM-4-MoE (DeepSeek-V3 routing with a shared expert); the tiny Llama for
the batch-sharded sampling run.
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
SETUP = PROBES + "host_setup"


@pytest.fixture(scope="session")
def moe_models(cache_root) -> dict[str, str]:
    from ascend_testkit.models.moe import (
        TinyMoeSpec,
        cached_scaled_experts_moe,
        cached_tiny_glm_moe,
        cached_tiny_qwen3_moe,
    )

    spec = TinyMoeSpec(route_skew=ROUTE_SKEW)
    folder = cache_root / "models"
    return {"qwen3": str(cached_tiny_qwen3_moe(spec, folder)), "scaled": str(cached_scaled_experts_moe(spec, folder)),
            "glm": str(cached_tiny_glm_moe(cache_dir=folder))}


@pytest.fixture(scope="session")
def moe_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def _generate(host, prompts) -> dict:
    return host.generate(prompts, max_tokens=MAX_TOKENS, logprobs=5)


class MoeRuns:
    """Each engine of the suite, run on first use and remembered for the session."""

    def __init__(self, pool, cpu_host, models, prompts, llama) -> None:
        self.pool, self.cpu, self.models, self.prompts, self.llama = pool, cpu_host, models, prompts, llama
        self.results: dict[str, dict] = {}
        self._seen: dict[str, dict[str, int]] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = getattr(self, f"_run_{name}")()
        return self.results[name]

    @property
    def sim(self):
        return self.pool.get("sim-moe", lane="simulated", setup=(SETUP,))

    @property
    def sim2(self):
        return self.pool.get("sim-2ranks", lane="simulated", cpus="0|1", setup=(SETUP,))

    def _usage(self, host) -> list[dict]:
        """Each rank's usage report, counting only this engine: a single-rank engine's worker lives in the host
        process, whose counters keep the earlier engines' counts (subtracted here)."""
        reports = host.usage()
        if len(reports) == 1:
            before = self._seen.get(host.name, {})
            self._seen[host.name] = dict(reports[0]["counts"])
            reports[0]["counts"] = {k: v - before.get(k, 0) for k, v in reports[0]["counts"].items()
                                    if v != before.get(k, 0)}
        return reports

    def _run(self, host, model, *, runner="v1", probes=(), **engine) -> dict:
        started = host.start(model, runner=runner, **(ENGINE | engine))
        try:
            result = {"startup_s": started["startup_s"], "outputs": _generate(host, self.prompts)["outputs"]}
            if host.lane == "simulated":
                result["usage"] = self._usage(host)
            for probe in probes:
                result[probe] = host.rpc(PROBES + probe)
        finally:
            host.stop()
        return result

    def _run_cpu_qwen3(self) -> dict:
        return self._run(self.cpu, self.models["qwen3"])

    def _run_qwen3(self) -> dict:
        return self._run(self.sim, self.models["qwen3"], probes=("routed_experts",),
                         additional_config={"kernel_checks": True})

    def _run_scaled(self) -> dict:
        return self._run(self.sim, self.models["scaled"], probes=("routed_experts",))

    def _run_cpu_glm(self) -> dict:
        return self._run(self.cpu, self.models["glm"])

    def _run_glm(self) -> dict:
        # Model Runner V2 (the simulated lane's default runner), where the Qwen3 engines run V1.
        return self._run(self.sim, self.models["glm"], runner="v2")

    def _run_expert_parallel(self) -> dict:
        """Experts split over two EP ranks with EPLB: generate (A), again across an automatic rebalance (B), then
        on the new placement (C); the load window before and after."""
        host = self.sim2
        host.start(self.models["qwen3"], runner="v1", tensor_parallel_size=2, enable_expert_parallel=True,
                   **(ENGINE | {"additional_config": EPLB}))
        try:
            out: dict = {"A": _generate(host, self.prompts)["outputs"]}
            out["state_A"] = host.rpc(PROBES + "eplb_state")
            out["window_A"] = host.rpc(PROBES + "eplb_window")
            out["B"] = _generate(host, self.prompts)["outputs"]
            out["state_B"] = host.rpc(PROBES + "eplb_state")
            host.rpc(PROBES + "eplb_reset")
            out["C"] = _generate(host, self.prompts)["outputs"]
            out["window_C"] = host.rpc(PROBES + "eplb_window")
            out["state_C"] = host.rpc(PROBES + "eplb_state")
            out["usage"] = self._usage(host)
        finally:
            host.stop()
        return out

    def _run_cpu_llama(self) -> dict:
        return self._run(self.cpu, self.llama)

    def _run_tp2_batch_sharded(self) -> dict:
        return self._run(self.sim2, self.llama, runner="v2", tensor_parallel_size=2,
                         enable_batch_sharded_sampling=True)


@pytest.fixture(scope="session")
def moe_runs(host_pool, cpu_host, moe_models, moe_prompts, tiny_model) -> MoeRuns:
    return MoeRuns(host_pool, cpu_host, moe_models, moe_prompts, str(tiny_model))


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
