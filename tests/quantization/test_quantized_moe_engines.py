"""Quantized MoE experts served end to end in the simulated lane: ModelSlim W8A8_DYNAMIC Qwen3-MoE and the production
DeepSeek recipe (MLA, W8A8_DYNAMIC dense layers, W4A8_DYNAMIC experts), each on V1 and MRV2 against plain vLLM CPU
(float32) on its dequantized float twin (`ascend_testkit.models.quantized_moe_reference`: the checkpoint's integers
times their scales; plain vLLM CPU cannot serve int8 / int4 experts on a host without AMX), with prompts across a
128-token block edge (in the prefill and in the decode); expert weights kept int8 / packed int4 in memory, every
quant op counted and no expert unquantized; the compressed-tensors int8 MoE twin token for token with the ModelSlim
one (the same integers); the NPU kernel backend (testkit torch_npu) running int4 experts with nothing falling back,
against the reference kernels.

The twin leaves out the engines' bfloat16 and per-token int8 activations: the checkpoints are conditioned
(`ascend_testkit.models.quantized_moe.CONDITIONING`) so that this noise stays below the model's logit margins,
which the unconditioned tiny models' did not (the engines, like plain vLLM CPU in bfloat16 on the float model,
parted from float32 within a few tokens).

Engines run once per module (`moe_runs[(host, model)]`, the quantization suite's hosts; "cpu" runs the twin).
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.engine_runs import EngineRuns

pytestmark = pytest.mark.engine

MAX_TOKENS = 12
# Inside a block, across one, chunked (64-token budget); 124 crosses the 128-token block edge while decoding, 131 in
# its prefill (chunks 64 + 64 + 3). Our engines run 128-token blocks (the suite's ENGINE), DeepSeek's MLA too: its
# engines leave block_size to the Ascend policy (128), since in this lane vLLM's CPU policy replaces a block size the
# user sets for an MLA model by 16 (its CPU MLA kernel's) on hosts without AMX.
PROMPT_LENGTHS = (5, 33, 70, 124, 131)
KV_BLOCK_SIZE = 128
KV_GROUPS_PROBE = "ascend_testkit.kv_probes:kv_groups"
# The twins in float32 on vLLM's CPU platform; DeepSeek's with vLLM's native rotary (its CPU rotary kernel
# mis-rotates MLA's 3-D queries) and its reference CPU_MLA backend named (AMX hosts would pick AMX_MLA, bf16 only).
TWIN_ENGINE = dict(dtype="float32", max_model_len=256, enforce_eager=True, max_num_seqs=4, seed=0)
TWIN_MLA = dict(compilation_config={"custom_ops": ["none", "-rotary_embedding"]}, attention_backend="CPU_MLA")
EXPERTS_PROBE = "ascend_testkit.quant_probes:expert_weights"
SPECS = {"qwen3_w8": dict(family="qwen3", experts="W8A8_DYNAMIC"),
         "qwen3_w4": dict(family="qwen3", experts="W4A8_DYNAMIC"),
         "qwen3_ct": dict(family="qwen3", experts="W8A8_DYNAMIC", fmt="compressed-tensors"),
         "deepseek_w4": dict(family="deepseek", experts="W4A8_DYNAMIC")}
QUANT_MOE_NPU_OPS = {"npu_moe_init_routing_v2", "npu_dynamic_quant", "npu_grouped_matmul", "npu_swiglu",
                     "npu_moe_token_unpermute"}


@pytest.fixture(scope="module")
def moe_checkpoints(cache_root) -> dict[str, dict[str, str]]:
    """name -> {"quantized": the checkpoint, "twin": its dequantized float twin (ModelSlim checkpoints only)}."""
    from ascend_testkit.models.quantized_moe import QuantizedMoeSpec, cached_quantized_moe
    from ascend_testkit.models.quantized_moe_reference import cached_dequantized_twin

    folder = cache_root / "models"
    out = {}
    for name, fields in SPECS.items():
        spec = QuantizedMoeSpec(**fields)
        quantized = cached_quantized_moe(spec, folder)
        out[name] = {"quantized": str(quantized)}
        if spec.fmt == "modelslim":
            out[name]["twin"] = str(cached_dequantized_twin(quantized))
    return out


@pytest.fixture(scope="module")
def quant_moe_prompts() -> list[str]:
    from ascend_testkit.models.tiny_llama import prompt_of_length

    return [prompt_of_length(n, offset=3 * n) for n in PROMPT_LENGTHS]


class MoeQuantRuns(EngineRuns):
    def __init__(self, hosts, checkpoints, prompts) -> None:
        super().__init__()
        self.hosts, self.checkpoints, self.prompts = hosts, checkpoints, prompts

    def _run(self, host_name: str, model: str) -> dict:
        if host_name == "cpu":
            return self._run_twin(model)
        host = self.hosts(host_name)
        engine = dict(self.hosts.engine)
        if model.startswith("deepseek"):
            del engine["block_size"]
        engine["additional_config"] = {"kernel_checks": True} | (
            {"kernel_backend": "npu"} if host_name == "npu" else {})
        host.start(self.checkpoints[model]["quantized"], **engine)
        try:
            before = host.usage()[0]
            outputs = host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=5)["outputs"]
            after = host.usage()[0]
            delta = {k: v - before["counts"].get(k, 0) for k, v in after["counts"].items()}
            npu_ops = {k: v - before["npu_ops"].get(k, 0) for k, v in after["npu_ops"].items()}
            return {"outputs": outputs, "counts": {k: v for k, v in delta.items() if v},
                    "npu_ops": {k: v for k, v in npu_ops.items() if v}, "facts": after["facts"],
                    "fallbacks": {k: v - before["fallbacks"].get(k, 0) for k, v in after["fallbacks"].items()
                                  if v != before["fallbacks"].get(k, 0)},
                    "fallback_reasons": after["fallback_reasons"], "experts": host.rpc(EXPERTS_PROBE)[0],
                    "kv_block_sizes": [g["block_size"] for g in host.rpc(KV_GROUPS_PROBE)[0]]}
        finally:
            host.stop()

    def _run_twin(self, model: str) -> dict:
        """Plain vLLM CPU on the dequantized twin: the reference."""
        host = self.hosts("cpu")
        host.start(self.checkpoints[model]["twin"],
                   **(TWIN_ENGINE | (TWIN_MLA if model.startswith("deepseek") else {})))
        try:
            return {"outputs": host.generate(self.prompts, max_tokens=MAX_TOKENS, logprobs=5)["outputs"]}
        finally:
            host.stop()


@pytest.fixture(scope="module")
def moe_runs(quant_hosts, moe_checkpoints, quant_moe_prompts) -> MoeQuantRuns:
    return MoeQuantRuns(quant_hosts, moe_checkpoints, quant_moe_prompts)


@pytest.mark.parametrize("runner", ["v1", "v2"])
@pytest.mark.parametrize("model", ["qwen3_w8", "deepseek_w4"])
def test_quantized_moe_matches_plain_vllm_cpu_on_the_dequantized_twin(moe_runs, model, runner):
    """Per-token int8 activations through int8 (Qwen3) / int4 (DeepSeek) experts and W8A8_DYNAMIC attention, dense
    and shared-expert layers, against the same integers made float in vLLM's own CPU model."""
    ours, twin = moe_runs[(runner, model)], moe_runs[("cpu", model)]
    assert ours["facts"]["runner"] == runner
    assert ours["kv_block_sizes"] == [KV_BLOCK_SIZE]  # the prompts cross a block edge
    assert "kernels.fused_moe_quant" in ours["counts"]
    check_logprobs_close(ours["outputs"], twin["outputs"], name_0=f"ascend {runner}", name_1="vLLM CPU (twin)")


# Bytes per parameter of the loaded expert weights, and the quant ops each generation counts (usage names).
EXPERT_BYTES = {"qwen3_w8": ("W8A8DynamicMoE", 1.0), "deepseek_w4": ("W4A8DynamicMoE", 0.5),
                "qwen3_ct": ("CompressedInt8DynamicMoE", 1.0)}
QUANT_COUNTS = {"qwen3_w8": {"kernels.fused_moe_quant", "kernels.dynamic_quant", "kernels.quant_matmul"},
                "deepseek_w4": {"kernels.fused_moe_quant", "kernels.dynamic_quant", "kernels.quant_matmul"},
                "qwen3_ct": {"kernels.fused_moe_quant", "kernels.dynamic_quant", "kernels.quant_matmul"}}
RUNNER_OF = {"qwen3_w8": "v1", "deepseek_w4": "v2", "qwen3_ct": "v1"}


@pytest.mark.parametrize("model", list(EXPERT_BYTES))
def test_expert_weights_stay_quantized_and_every_quant_op_is_counted(moe_runs, model):
    run = moe_runs[(RUNNER_OF[model], model)]
    method, per_param = EXPERT_BYTES[model]
    assert list(run["experts"]) == [method], run["experts"]
    seen = run["experts"][method]
    assert seen["dtypes"] == ["torch.int8"] and seen["bytes"] / seen["params"] == per_param, seen
    assert {k for k in run["counts"] if "quant" in k} == QUANT_COUNTS[model], run["counts"]
    assert "kernels.fused_moe" not in run["counts"]  # no expert ran unquantized


def test_compressed_tensors_moe_twin_gives_the_modelslim_tokens(moe_runs):
    """The same integers in compressed-tensors form (vLLM's int8 MoE scheme, our kernels) and ModelSlim's."""
    ct, ms = moe_runs[("v1", "qwen3_ct")], moe_runs[("v1", "qwen3_w8")]
    assert [o["token_ids"] for o in ct["outputs"]] == [o["token_ids"] for o in ms["outputs"]]


def test_npu_backend_runs_int4_experts_with_no_fallback(moe_runs):
    """W4A8 experts (and W8A8_DYNAMIC attention) with kernel_backend npu over the testkit's torch_npu: int8 x int4
    grouped matmuls with ModelSlim's scale_bias as the kernel's bias, against the reference kernels."""
    npu = moe_runs[("npu", "qwen3_w4")]
    assert npu["facts"]["kernel_backend"] == "npu"
    assert QUANT_MOE_NPU_OPS | {"npu_quant_matmul"} <= set(npu["npu_ops"]), npu["npu_ops"]
    assert npu["fallbacks"] == {}, npu["fallback_reasons"]
    assert npu["experts"]["W4A8DynamicMoE"]["bytes"] / npu["experts"]["W4A8DynamicMoE"]["params"] == 0.5
    reference = moe_runs[("v1", "qwen3_w4")]
    assert reference["facts"]["kernel_backend"] == "reference"
    check_logprobs_close(npu["outputs"], reference["outputs"], name_0="npu kernels", name_1="reference kernels")
