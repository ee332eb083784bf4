"""The quantization suite's engines: int8 checkpoints of the tiny Llama (compressed-tensors and ModelSlim twins
holding the same integers, `ascend_testkit.models.quantized`) on vLLM's own CPU platform (the static checkpoints'
anchor: its oneDNN int8 kernels; the dynamic ones' is the float64 reference of their integers) and on ours in the
simulated lane (V1 and MRV2), plus one engine over the testkit's torch_npu with the NPU kernel backend.

The hosts are the session's shared ones (`cpu`, `sim-v1`, `sim`, and the NPU kernel suite's `npu-v1`): the
platform's `check_and_update_config` detects and configures the quantization itself. `quant_runs[(host, model)]`
runs an engine once per module and keeps its outputs (top-5 logprobs), our usage counts over its generation, the
torch_npu ops and fallbacks of that generation, the loaded linears' weight bytes and the KV cache our allocator cut
(per layer: dtype, bytes per token; per KV cache group: page bytes per layer).
"""

from __future__ import annotations

import pytest

from ascend_testkit.counters import counter_delta
from ascend_testkit.engine_runs import EngineRuns

PROMPT_LENGTHS = (5, 33, 70)
MAX_TOKENS = 12
# bfloat16: ModelSlim's scales are in the model dtype, and torch_npu's quant matmul writes float16 / bfloat16.
ENGINE = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0, block_size=128,
              max_num_batched_tokens=64, enable_chunked_prefill=True, enable_prefix_caching=False)
CPU_ENGINE = dict(dtype="bfloat16", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)
# The npu_kernels suite's "npu-v1" host settings (the reference's native loops off: what a device runs)
FAKE_ENV = {"ASCEND_TESTKIT_TORCH_NPU": "1", "ASCEND_VLLM_NATIVE_KERNELS": "0"}
PROBE = "ascend_testkit.quant_probes:linear_weights"
KV_PROBES = {"kv_layers": "ascend_testkit.kv_probes:layer_kv", "kv_groups": "ascend_testkit.kv_probes:kv_groups"}
# A mixed ModelSlim checkpoint: every served type in one model (W8A8 attention in layer 0, W8A16 MLP in layer 0,
# a FLOAT down projection in layer 1, W8A8_DYNAMIC elsewhere), so one engine runs all four quant ops.
MIXED_TYPES = (
    *((f"model.layers.0.self_attn.{p}", "W8A8") for p in ("q_proj", "k_proj", "v_proj", "o_proj")),
    *((f"model.layers.0.mlp.{p}", "W8A16") for p in ("gate_proj", "up_proj", "down_proj")),
    ("model.layers.1.mlp.down_proj", "FLOAT"),
)


@pytest.fixture(scope="session")
def quant_models(cache_root) -> dict[str, str]:
    from ascend_testkit.models.quantized import DYNAMIC_CONDITIONING as COND
    from ascend_testkit.models.quantized import QuantizedSpec, cached_quantized_llama

    folder = cache_root / "models"
    specs = {"ct_static": QuantizedSpec(fmt="compressed-tensors", activations="static"),
             "ct_dynamic": QuantizedSpec(fmt="compressed-tensors", activations="dynamic", conditioning=COND),
             "ms_static": QuantizedSpec(fmt="modelslim", activations="static"),
             "ms_dynamic": QuantizedSpec(fmt="modelslim", activations="dynamic", conditioning=COND),
             "ms_mixed": QuantizedSpec(fmt="modelslim", activations="dynamic", layer_types=MIXED_TYPES)}
    return {name: str(cached_quantized_llama(spec, folder)) for name, spec in specs.items()}


@pytest.fixture(scope="session")
def quant_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


class QuantHosts:
    """`quant_hosts(name)`: "cpu" (vLLM's CPU platform), "v1" / "v2" (ours, simulated lane), "npu" (ours, V1, over
    the testkit's torch_npu); `.engine`: our engines' arguments."""

    engine = ENGINE

    def __init__(self, pool) -> None:
        self.pool = pool

    def __call__(self, name: str):
        if name == "cpu":
            return self.pool.get("cpu", lane="cpu", runner="v1")
        if name == "npu":
            return self.pool.get("npu-v1", lane="simulated", runner="v1", env=FAKE_ENV)
        if name == "v1":
            return self.pool.get("sim-v1", lane="simulated", runner="v1")
        return self.pool.get("sim", lane="simulated", runner=None)  # Model Runner V2, vLLM's default here


class QuantRuns(EngineRuns):
    def __init__(self, hosts, models, prompts) -> None:
        super().__init__()
        self.hosts, self.models, self.prompts = hosts, models, prompts

    def _run(self, host_name: str, model: str) -> dict:
        host = self.hosts(host_name)
        ours = host_name != "cpu"
        engine = dict(ENGINE) if ours else dict(CPU_ENGINE)
        if host_name == "npu":
            engine["additional_config"] = {"kernel_backend": "npu", "kernel_checks": True}
        elif ours:
            engine["additional_config"] = {"kernel_checks": True}
        host.start(self.models[model], **engine)
        try:
            before = host.usage()[0] if ours else None
            outputs = host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=5)["outputs"]
            result = {"outputs": outputs}
            if ours:
                after = host.usage()[0]
                result.update(counts=counter_delta(after["counts"], before["counts"]),
                              npu_ops=counter_delta(after["npu_ops"], before["npu_ops"]),
                              fallbacks=counter_delta(after["fallbacks"], before["fallbacks"]),
                              fallback_reasons=after["fallback_reasons"], facts=after["facts"],
                              linears=host.rpc(PROBE)[0])
                result.update({name: host.rpc(probe)[0] for name, probe in KV_PROBES.items()})
        finally:
            host.stop()
        return result


@pytest.fixture(scope="module")
def quant_hosts(host_pool) -> QuantHosts:
    return QuantHosts(host_pool)


@pytest.fixture(scope="module")
def quant_runs(quant_hosts, quant_models, quant_prompts) -> QuantRuns:
    return QuantRuns(quant_hosts, quant_models, quant_prompts)


# The C8 (int8 KV cache) GQA Llama's prompts: inside a block; decoding across the 128-token edge; a prompt whose
# second 64-token chunk crosses it.
C8_PROMPT_LENGTHS = (5, 124, 140)


@pytest.fixture(scope="module")
def c8_model(cache_root) -> str:
    from ascend_testkit.models.quantized import QuantizedSpec, cached_quantized_llama
    from ascend_testkit.models.tiny_llama import TinyModelSpec

    base = TinyModelSpec(num_heads=4, num_kv_heads=2, head_dim=32)
    spec = QuantizedSpec(base=base, fmt="modelslim", activations="FLOAT", kv_cache="C8")
    return str(cached_quantized_llama(spec, cache_root / "models"))


@pytest.fixture(scope="module")
def c8_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in C8_PROMPT_LENGTHS]


class W8A8References(dict):
    """`w8a8_references[model]`: the float64 reference of a compressed-tensors checkpoint (its integers and its
    activation scheme computed exactly, `ascend_testkit.models.quantized_reference`; the dynamic twins are built
    conditioned for it), computed once per module."""

    def __init__(self, models, prompts) -> None:
        super().__init__()
        self.models, self.prompts = models, prompts

    def __missing__(self, model: str) -> list[dict]:
        from ascend_testkit.models.quantized_reference import w8a8_float64_outputs

        self[model] = w8a8_float64_outputs(self.models[model], self.prompts, MAX_TOKENS, logprobs=5)
        return self[model]


@pytest.fixture(scope="module")
def w8a8_references(quant_models, quant_prompts) -> W8A8References:
    return W8A8References(quant_models, quant_prompts)


@pytest.fixture(scope="module")
def c8_runs(quant_hosts, c8_model, c8_prompts) -> QuantRuns:
    return QuantRuns(quant_hosts, {"c8": c8_model}, c8_prompts)


@pytest.fixture(scope="module")
def c8_reference(c8_model, c8_prompts) -> list[dict]:
    """transformers in float64 with every cached key and value put through the checkpoint's int8 round trip."""
    from ascend_testkit.models.quantized_kv import c8_float64_outputs

    return c8_float64_outputs(c8_model, c8_prompts, MAX_TOKENS, logprobs=5)
