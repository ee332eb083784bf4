"""The PCP suite's engines: prefill context parallel of 2 in the simulated lane against PCP=1.

`pcp_runs` runs each engine once per session and keeps what it saw. The PCP=2 engine has a host of its own: two
ranks (vLLM spawns two workers, gloo), one core each, and `VLLM_USE_BREAKABLE_CUDAGRAPH=1` in its environment so
that its `full_and_piecewise` graph mode keeps PIECEWISE graphs without torch.compile (the simulated lane records
what it would capture and replay). Capture sizes end at 76 tokens, so the seed's 151-token rank-local batch finds a
76-token graph it must not be squeezed into. The PCP=1 reference runs eagerly on the shared MRV2 host. Both run the
same calls in the same order (one batch, then one prompt at a time, whose prompts now hit the prefix cache, then the
seed's 298 + 2 token prefills in one step), so prefix caching and chunked prefill (512-token budget) act alike.
"""

from __future__ import annotations

import json
import shutil

import pytest

PROMPT_LENGTHS = (1, 31, 32, 33, 151, 300)
SEED_LENGTHS = (298, 2)  # PCP=2: rank 1 holds 75 + 75 + 1 = 151 real tokens of this one step
MAX_TOKENS = 8
CAPTURE_SIZES = [2, 4, 8, 16, 32, 76]
ENGINE = dict(dtype="float32", max_model_len=512, max_num_seqs=8, block_size=32, max_num_batched_tokens=512,
              seed=0)
PCP_ENGINE = dict(prefill_context_parallel_size=2, enforce_eager=False,
                  additional_config={"graph_mode": "full_and_piecewise", "graph_capture_sizes": CAPTURE_SIZES,
                                     "kernel_checks": True})
PCP_HOST_ENV = {"VLLM_USE_BREAKABLE_CUDAGRAPH": "1"}


@pytest.fixture(scope="session")
def pcp_settings() -> dict:
    return {"prompt_lengths": PROMPT_LENGTHS, "seed_lengths": SEED_LENGTHS, "capture_sizes": CAPTURE_SIZES,
            "max_num_seqs": ENGINE["max_num_seqs"]}


def _prompts(lengths) -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=n) for n in lengths]


def sliding_window_model(tiny_model, folder):
    """The tiny Llama's weights under a Mistral config with a 64-token sliding window (refused under PCP)."""
    if not (folder / "config.json").exists():
        shutil.copytree(tiny_model, folder)
        config = json.loads((folder / "config.json").read_text())
        config.update(architectures=["MistralForCausalLM"], model_type="mistral", sliding_window=64)
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def run(host, model, **engine) -> dict:
    started = host.start(model, **(ENGINE | engine))
    result = {"platform": started["platform"], "startup_s": started["startup_s"]}
    result["batch"] = host.generate(_prompts(PROMPT_LENGTHS), max_tokens=MAX_TOKENS)["outputs"]
    result["sequential"] = host.generate(_prompts(PROMPT_LENGTHS), max_tokens=MAX_TOKENS, sequential=True)["outputs"]
    result["seed"] = host.generate(_prompts(SEED_LENGTHS), max_tokens=MAX_TOKENS)["outputs"]
    result["usage"] = host.usage()
    result["pcp"] = host.rpc("ascend_testkit.pcp_probes:pcp_state")
    result["graph"] = host.rpc("ascend_testkit.pcp_probes:graph_state")
    host.stop()
    return result


class PCPRuns:
    def __init__(self, host_pool, sim_host, model, cache_root) -> None:
        self.pool, self.sim, self.model, self.cache_root = host_pool, sim_host, model, cache_root
        self.results: dict[str, dict] = {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = getattr(self, f"_run_{name}")()
        return self.results[name]

    def _pcp_host(self):
        return self.pool.get("sim-pcp", lane="simulated", runner="v2", cpus="0|1", env=PCP_HOST_ENV)

    def _run_pcp2(self) -> dict:
        return run(self._pcp_host(), self.model, **PCP_ENGINE)

    def _run_pcp1(self) -> dict:
        return run(self.sim, self.model, enforce_eager=True)

    def _run_refusals(self) -> dict:
        from ascend_testkit.models.deepseek import cached_tiny_deepseek

        self["pcp2"]  # the host's engine first: refusals stop in the main process, before any worker
        host = self._pcp_host()
        models = {"mla": cached_tiny_deepseek(cache_dir=self.cache_root / "models"),
                  "sliding_window": sliding_window_model(self.model, self.cache_root / "models" / "tiny-mistral-sw")}
        return {name: host.start_error(model, **(ENGINE | PCP_ENGINE)) for name, model in models.items()}


@pytest.fixture(scope="session")
def pcp_runs(host_pool, sim_host, tiny_model, cache_root) -> PCPRuns:
    return PCPRuns(host_pool, sim_host, tiny_model, cache_root)
