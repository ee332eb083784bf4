"""The NPU-kernel suite's engines: `ascend_kernels`' torch_npu bindings inside real vLLM engines, over the testkit's
schema-faithful torch_npu (`ASCEND_TESTKIT_TORCH_NPU=1`: its ops registered with the 2.13.0 wheel's schemas, their
outputs held to the wheel's meta functions), against the reference kernels in the same lane.

Two hosts of their own ("npu-v1", "npu-v2": the fake is per process, installed by the testkit's vLLM general plugin
before the engine's first config), each running its engines one after another: every model with `kernel_backend=
"npu"` on both runners, and with the default (`auto`, which stays the reference kernels in the simulated lane even
with a torch_npu present) on the runner(s) the tests compare with (test_npu_engines.REFERENCE_RUNNER). Models: a tiny
GQA Llama (4 query heads of 128 over 2 KV heads), DeepSeek-V2 (MLA), DeepSeek V3.2 (sparse attention) and Qwen3-MoE
(GQA 2:1, softmax top-2 of 8 experts). Chunked prefill over 128-token blocks (a 64-token budget): prompts inside, at
and across a block edge, long ones arriving in chunks that continue a cached context, decodes sharing steps with
prefill chunks.

`npu_runs[(model, runner, backend)]` runs an engine on first use and keeps its outputs (top-5 logprobs) and what its
generation alone ran (the host's counters are process-wide): our usage counts, the torch_npu ops the bindings called,
the fallbacks, and the fake's own per-op call counts. `npu_runs[("llama", "v2", "npu", 2)]` is the Llama under prefill
context parallel of 2 on the NPU backend (a host of its own: two ranks, one core each; the same engine arguments, so
the 64-token budget cuts the long prompts into chunks that continue a context and every PCP part runs: the step's
keys, the cached context and their log-sum-exp merge); it keeps each rank's counters (`ranks`).
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.counters import counter_delta
from ascend_testkit.engine_runs import EngineRuns

# The reference's native loops off in this suite's hosts: its tensors are host tensors (the fake torch_npu runs on the
# CPU), so the loops would take the ops a device runs as references (slot mapping, ...) and the reference engines'
# decodes, where a device runs the torch formulation; and the comparison the suite makes is with that formulation.
# (Measured: with the loops on, the Qwen3-MoE comparison flips a routing decision and fails although the native
# decode matched float64-rounded outputs in 4,222 of 4,224 elements against the torch formulation's 3,708; 1 %
# relative noise on the torch formulation's decode output fails it the same way, 0.6 % does not.)
FAKE_ENV = {"ASCEND_TESTKIT_TORCH_NPU": "1", "ASCEND_VLLM_NATIVE_KERNELS": "0"}
PLUGIN = "ascend_testkit.torch_npu_plugin:install_if_requested"
# Around the edges of 128-token blocks (torch_npu's paged attention takes a query longer than one token only over
# blocks of a multiple of 128), arriving in chunks of a 64-token budget.
PROMPT_LENGTHS = (5, 127, 128, 129, 200)
MAX_TOKENS = 12
LOGPROBS = 5
# bfloat16: torch_npu's cache and attention kernels take float16 / bfloat16 (and int8), not float32.
ENGINE = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0, block_size=128,
              max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False)
BACKENDS = {"npu": {"kernel_backend": "npu", "kernel_checks": True}, "auto": {"kernel_checks": True}}
PROBES = "ascend_testkit.torch_npu_probes:"
# Top-k / top-p sampling (vLLM's draw, our filter) after the greedy generation, for these models. Unseeded: with a
# per-request seed, vLLM 0.32's V1 runner rewinds the request's generator after a chunked-prefill step by its Philox
# offset, which a CPU generator does not have ("CPU Generator does not use offset": plain vLLM CPU fails the same).
SAMPLED_MODELS = ("llama",)
SAMPLED = dict(max_tokens=6, temperature=0.8, top_k=20, top_p=0.9, ignore_eos=True)


@pytest.fixture(scope="session")
def npu_models(cache_root) -> dict[str, str]:
    from ascend_testkit.models.deepseek import TinyDeepseekSpec, cached_tiny_deepseek
    from ascend_testkit.models.moe import TinyMoeSpec, cached_tiny_qwen3_moe
    from ascend_testkit.models.tiny_llama import TinyModelSpec, cached_tiny_llama

    folder = cache_root / "models"
    # DeepSeek's own head sizes (q/k 128 + 64 rope, v 128) and the Llama's 128: torch_npu's attention without pages
    # (MLA prefill, PCP's step keys) takes q/k/v head sizes (128, 128), (192, 128) or (192, 192) only. The V3.2 and
    # Qwen3-MoE specs are the MLA and MoE suites' (the same cached checkpoints).
    deepseek_v2 = TinyDeepseekSpec(qk_nope_head_dim=128, v_head_dim=128)
    v32 = TinyDeepseekSpec(model_type="deepseek_v32", q_lora_rank=32, index_topk=16, index_n_heads=4,
                           index_head_dim=128)
    return {"llama": str(cached_tiny_llama(TinyModelSpec(num_heads=4, num_kv_heads=2, head_dim=128), folder)),
            "deepseek_v2": str(cached_tiny_deepseek(deepseek_v2, folder)),
            "deepseek_v32": str(cached_tiny_deepseek(v32, folder)),
            "qwen3_moe": str(cached_tiny_qwen3_moe(TinyMoeSpec(route_skew=2.0), folder))}


@pytest.fixture(scope="session")
def npu_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


def npu_host(host_pool, runner: str, name: str = "npu", env: dict[str, str] | None = None,
             cpus: str | None = None):
    """The suite's host of `runner` with the testkit's torch_npu in its process (vLLM's general plugin installs it:
    the testkit's entry point must be installed, which `uv sync` does)."""
    from importlib.metadata import entry_points

    if PLUGIN not in [ep.value for ep in entry_points(group="vllm.general_plugins")]:
        pytest.fail(f"vLLM sees no general plugin {PLUGIN} (the testkit's entry point): run `uv sync`")
    return host_pool.get(f"{name}-{runner}", lane="simulated", runner=runner, env=FAKE_ENV | (env or {}), cpus=cpus)


def _rank_delta(before: dict, after: dict) -> dict:
    """What one rank ran between two snapshots of its counters."""
    usage, then = after["usage"], before["usage"]
    return {"facts": usage["facts"], "counts": counter_delta(usage["counts"], then["counts"]),
            "npu_ops": counter_delta(usage["npu_ops"], then["npu_ops"]),
            "fallbacks": counter_delta(usage["fallbacks"], then["fallbacks"]),
            "fallback_reasons": usage["fallback_reasons"],
            "fake_calls": counter_delta(after["fake_calls"], before["fake_calls"])}


class NpuRuns(EngineRuns):
    def __init__(self, host_pool, models, prompts) -> None:
        super().__init__()
        self.pool, self.models, self.prompts = host_pool, models, prompts

    @staticmethod
    def _snapshot(host) -> list[dict]:
        """Each rank's usage report and the fake's call counts in its process."""
        return [{"usage": usage, "fake_calls": calls}
                for usage, calls in zip(host.usage(), host.rpc(PROBES + "fake_calls"), strict=True)]

    def _host(self, runner: str, pcp: int):
        if pcp == 1:
            return npu_host(self.pool, runner)
        # One core per rank (vLLM spawns a worker per rank; gloo between them), as the PCP suite's host.
        return npu_host(self.pool, runner, name=f"npu-pcp{pcp}", cpus="|".join(str(i) for i in range(pcp)))

    def _run(self, model: str, runner: str, backend: str, pcp: int = 1) -> dict:
        host = self._host(runner, pcp)
        engine = ENGINE | {"additional_config": BACKENDS[backend]}
        if pcp > 1:
            engine["prefill_context_parallel_size"] = pcp
        started = host.start(self.models[model], **engine)
        try:
            before = self._snapshot(host)
            outputs = host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=LOGPROBS)["outputs"]
            sampled = None
            if model in SAMPLED_MODELS and pcp == 1:  # the sampling filter on both runners' samplers
                sampled = host.generate(self.prompts, **SAMPLED)["outputs"]
            after = self._snapshot(host)
        finally:
            host.stop()
        ranks = [_rank_delta(b, a) for b, a in zip(before, after, strict=True)]
        # Without PCP the one worker's counters are the run's own keys (as every test reads them).
        return {"startup_s": started["startup_s"], "outputs": outputs, "sampled": sampled, "ranks": ranks,
                **(ranks[0] if pcp == 1 else {})}


@pytest.fixture(scope="session")
def npu_engine() -> dict:
    """The suite's engine arguments."""
    return dict(ENGINE)


@pytest.fixture(scope="session")
def npu_hosts(host_pool):
    """`npu_hosts(runner, name="npu", env=None)`: a host with the testkit's torch_npu (see `npu_host`)."""
    return lambda runner, name="npu", env=None: npu_host(host_pool, runner, name, env)


@pytest.fixture(scope="session")
def npu_runs(host_pool, npu_models, npu_prompts) -> NpuRuns:
    return NpuRuns(host_pool, npu_models, npu_prompts)


@pytest.fixture(scope="session")
def logprobs_close():
    return check_logprobs_close
