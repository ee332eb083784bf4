"""The encoder-only attention on the NPU kernel backend: BERT's non-causal layers through `attention_with_lse`'s
torch_npu binding (`npu_fused_infer_attention_score`, TND q/k/v, no mask) over the testkit's schema-faithful torch_npu,
against the reference kernels on the same host, model and dtype.

The host is the NPU-kernel suite's MRV2 one (`tests/npu_kernels`: the fake torch_npu installed by the testkit's vLLM
general plugin); its attention without pages takes head size 128 and float16 / bfloat16 only, hence this BERT's
shape and dtype.
"""

from __future__ import annotations

import numpy as np
import pytest

from ascend_testkit.models.embedding import TinyEmbeddingSpec, cached_tiny_bert
from ascend_testkit.models.word_tokenizer import prompt_of_length

pytestmark = [pytest.mark.engine]

# as tests/npu_kernels/conftest.py, whose host this is (the reference's native loops off: what a device runs)
FAKE_ENV = {"ASCEND_TESTKIT_TORCH_NPU": "1", "ASCEND_VLLM_NATIVE_KERNELS": "0"}
PLUGIN = "ascend_testkit.torch_npu_plugin:install_if_requested"
PROBES = "ascend_testkit.torch_npu_probes:"
ENGINE = {"dtype": "bfloat16", "max_model_len": 256, "enforce_eager": True, "max_num_seqs": 4, "block_size": 128}
BACKENDS = {"npu": {"kernel_backend": "npu", "kernel_checks": True}, "reference": {"kernel_checks": True}}
LENGTHS = (3, 17, 130, 200)
COSINE_TOLERANCE = 1e-4
NUM_LAYERS = 2


@pytest.fixture(scope="module")
def npu_host(host_pool):
    from importlib.metadata import entry_points

    if PLUGIN not in [ep.value for ep in entry_points(group="vllm.general_plugins")]:
        pytest.fail(f"vLLM sees no general plugin {PLUGIN} (the testkit's entry point): run `uv sync`")
    return host_pool.get("npu-v2", lane="simulated", runner="v2", env=FAKE_ENV)


@pytest.fixture(scope="module")
def runs(npu_host, cache_root) -> dict[str, dict]:
    model = cached_tiny_bert(TinyEmbeddingSpec(hidden_size=256, intermediate_size=256), cache_root / "models")
    prompts = [prompt_of_length(n, offset=5 * n) for n in LENGTHS]
    out = {}
    for name, config in BACKENDS.items():
        npu_host.start(str(model), **ENGINE, additional_config=config)
        try:
            before = npu_host.usage()[0], npu_host.rpc(PROBES + "fake_calls")[0]
            embeddings = np.array(npu_host.embed(prompts)["embeddings"])
            after = npu_host.usage()[0], npu_host.rpc(PROBES + "fake_calls")[0]
        finally:
            npu_host.stop()
        delta = [
            {k: v - b.get(k, 0) for k, v in a.items() if v != b.get(k, 0)}
            for a, b in (
                (after[0]["counts"], before[0]["counts"]),
                (after[0]["npu_ops"], before[0]["npu_ops"]),
                (after[0]["fallbacks"], before[0]["fallbacks"]),
                (after[1], before[1]),
            )
        ]
        out[name] = {
            "embeddings": embeddings,
            "counts": delta[0],
            "npu_ops": delta[1],
            "fallbacks": delta[2],
            "fake_calls": delta[3],
            "backend": after[0]["facts"]["kernel_backend"],
            "impls": after[0]["attention_impls"],
        }
    return out


def test_encoder_attention_runs_the_torch_npu_binding(runs):
    npu = runs["npu"]
    assert npu["backend"] == "npu" and npu["impls"] == ["AscendEncoderOnlyAttentionImpl"]
    assert npu["counts"].get("attention.ascend.encoder_only.forward", 0) >= NUM_LAYERS
    assert npu["fake_calls"].get("npu_fused_infer_attention_score", 0) >= NUM_LAYERS, npu["fake_calls"]
    assert not npu["fallbacks"], npu["fallbacks"]
    assert runs["reference"]["backend"] == "reference"
    assert not runs["reference"]["fake_calls"].get("npu_fused_infer_attention_score")


def test_npu_binding_embeddings_equal_the_reference_kernels(runs):
    ours, ref = runs["npu"]["embeddings"], runs["reference"]["embeddings"]
    assert ours.shape == ref.shape == (len(LENGTHS), 256)
    distance = 1.0 - (ours * ref).sum(-1) / (np.linalg.norm(ours, axis=-1) * np.linalg.norm(ref, axis=-1))
    assert (distance < COSINE_TOLERANCE).all(), distance
