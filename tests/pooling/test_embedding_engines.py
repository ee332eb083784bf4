"""Embedding (pooling) models in the simulated-NPU lane on both model runners, against plain vLLM CPU on the same
tiny random checkpoints: a decoder-based one (Qwen3, last-token pooling, normalized, as Qwen3-Embedding) through the
decoder attention backend, and an encoder-only BERT (mean pooling, normalized) whose non-causal attention runs in
ASCEND_ENCODER_ONLY through the kernel facade's `attention_with_lse`. vLLM 0.32's Model Runner V2 serves pooling
models and encoder-only layers (its `PoolingRunner`, `EncoderOnlyModelState`), so both runners are checked; what the
encoder-only backend cannot serve (a sliding window: ModernBERT's local layers) is refused at start-up by name.
"""

from __future__ import annotations

import numpy as np
import pytest

from ascend_testkit.counters import counter_delta
from ascend_testkit.models.embedding import cached_tiny_bert, cached_tiny_modernbert, cached_tiny_qwen3_embedding
from ascend_testkit.models.word_tokenizer import prompt_of_length

pytestmark = [pytest.mark.engine]

ENGINE = {"dtype": "float32", "max_model_len": 128, "enforce_eager": True, "max_num_seqs": 4, "block_size": 32}
# One batch of prompts of several lengths: 40 and 65 tokens span block edges (block size 32).
LENGTHS = (3, 17, 40, 65)
COSINE_TOLERANCE = 1e-4
NUM_LAYERS = 2
# `convert="embed"` makes vLLM run the causal LM checkpoint as an embedding model (runner "pooling"); BERT is one.
MODELS = {"qwen3": {"convert": "embed"}, "bert": {}}
RUNNERS = {"sim_v1_host": "SimulatedModelRunnerV1", "sim_host": "SimulatedModelRunnerV2"}


@pytest.fixture(scope="module")
def model_paths(cache_root) -> dict[str, str]:
    models = cache_root / "models"
    return {
        "qwen3": str(cached_tiny_qwen3_embedding(cache_dir=models)),
        "bert": str(cached_tiny_bert(cache_dir=models)),
    }


@pytest.fixture(scope="module")
def prompts() -> list[str]:
    return [prompt_of_length(n, offset=3 * n) for n in LENGTHS]


def _counts(host) -> dict[str, int]:
    return dict(host.usage()[0]["counts"])


def embed(host, model: str, prompts: list[str], usage: bool = True, **engine) -> tuple[np.ndarray, dict | None]:
    """The prompts' embeddings from a fresh engine on `host`, and (simulated lane) what our parts did for them: the
    worker's usage counters as deltas over the embedding call (a host's counters add up over its engines), its
    attention impls and runner."""
    host.start(model, **ENGINE, **engine)
    try:
        before = _counts(host) if usage else {}
        out = np.array(host.embed(prompts)["embeddings"])
        report = None
        if usage:
            after = host.usage()[0]
            report = {
                "delta": counter_delta(after["counts"], before),
                "impls": after["attention_impls"],
                "runner": after["facts"]["runner_class"],
            }
    finally:
        host.stop()
    return out, report


@pytest.fixture(scope="module")
def reference(cpu_host, model_paths, prompts) -> dict[str, np.ndarray]:
    """Plain vLLM CPU's embeddings of each model (V1 runner, its own CPU attention)."""
    return {
        name: embed(cpu_host, model_paths[name], prompts, usage=False, **extra)[0] for name, extra in MODELS.items()
    }


def cosine_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return 1.0 - (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def check_embeddings(ours: np.ndarray, ref: np.ndarray) -> None:
    assert ours.shape == ref.shape == (len(LENGTHS), 64)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)  # normalized, as modules.json says
    distance = cosine_distance(ours, ref)
    assert (distance < COSINE_TOLERANCE).all(), f"cosine distances to vLLM CPU: {distance}"
    # the prompts' embeddings differ from one another, so agreeing with the reference says something
    pairs = [cosine_distance(ref[i], ref[j]) for i in range(len(ref)) for j in range(i + 1, len(ref))]
    assert min(pairs) > 1e-2, pairs


@pytest.mark.parametrize("host_name", list(RUNNERS))
def test_decoder_embedding_model_equals_vllm_cpu(request, host_name, model_paths, prompts, reference):
    """Qwen3 as an embedding model: its causal attention in ASCEND (paged cache), last-token pooled."""
    host = request.getfixturevalue(host_name)
    ours, report = embed(host, model_paths["qwen3"], prompts, **MODELS["qwen3"])
    check_embeddings(ours, reference["qwen3"])
    assert report["runner"].endswith(RUNNERS[host_name])
    assert report["impls"] == ["AscendAttentionImpl"]
    # one prefill step for the whole batch, each layer through our cache write and paged attention
    assert report["delta"].get("attention.ascend.forward", 0) >= NUM_LAYERS
    assert report["delta"].get("kernels.paged_attention", 0) >= NUM_LAYERS
    assert report["delta"].get("kernels.reshape_and_cache", 0) >= NUM_LAYERS


@pytest.mark.parametrize("host_name", list(RUNNERS))
def test_encoder_only_embedding_model_equals_vllm_cpu(request, host_name, model_paths, prompts, reference):
    """BERT: its non-causal encoder attention in ASCEND_ENCODER_ONLY (no KV cache written or read), mean-pooled."""
    host = request.getfixturevalue(host_name)
    ours, report = embed(host, model_paths["bert"], prompts)
    check_embeddings(ours, reference["bert"])
    assert report["runner"].endswith(RUNNERS[host_name])
    assert report["impls"] == ["AscendEncoderOnlyAttentionImpl"]
    delta = report["delta"]
    assert delta.get("attention.ascend.encoder_only.forward", 0) >= NUM_LAYERS
    assert delta.get("kernels.attention_with_lse", 0) == delta["attention.ascend.encoder_only.forward"]
    for cache_op in ("kernels.paged_attention", "kernels.reshape_and_cache", "attention.ascend.forward"):
        assert cache_op not in delta, delta


def test_encoder_only_sliding_window_is_refused_at_start_up(sim_v1_host, cache_root):
    """ModernBERT's local (sliding-window) encoder layers: the dense non-causal op has no window, so the engine
    refuses to start, naming the backend and why (plain vLLM CPU serves this checkpoint: its CPU attention has one)."""
    model = cached_tiny_modernbert(cache_dir=cache_root / "models")
    error = sim_v1_host.start_error(model, **ENGINE)
    assert error is not None, "ModernBERT with local attention started on ASCEND_ENCODER_ONLY"
    assert error["type"] == "AttentionConfigError"
    assert "ASCEND_ENCODER_ONLY" in error["message"] and "sliding window" in error["message"]


SERVE_PORT = 8390  # inside the session's loopback-only namespace


def test_v1_embeddings_through_ascend_vllm_serve(tmp_path, netns, model_paths, prompts, reference):
    """`ascend-vllm serve MODEL --runner pooling` (simulated lane, vLLM's default runner there: MRV2) answers
    OpenAI's `/v1/embeddings` with plain vLLM CPU's embeddings, and its worker says our attention served them."""
    import json
    import urllib.request

    from ascend_testkit.servers import inside, start_serve, tiny_serve_args

    args = tiny_serve_args(max_model_len=128, max_num_seqs=4, served_model_name="tiny-embed") + ["--runner", "pooling"]
    server = start_serve(
        "embed",
        model_paths["qwen3"],
        SERVE_PORT,
        log_dir=tmp_path,
        cpu=None,
        netns=netns,
        args=args,
        env_extra={"VLLM_SERVER_DEV_MODE": "1"},
    )
    try:
        server.wait_healthy()
        with inside(netns):
            client = server.openai_client()
            out = client.embeddings.create(model="tiny-embed", input=prompts, encoding_format="float")
            req = urllib.request.Request(
                server.url + "/collective_rpc",
                method="POST",
                data=json.dumps({"method": "ascend_usage"}).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as resp:
                usage = json.loads(resp.read())["results"][0]
    finally:
        server.close()
    assert [d.index for d in out.data] == list(range(len(prompts)))
    assert out.usage.prompt_tokens == sum(LENGTHS)
    check_embeddings(np.array([d.embedding for d in out.data]), reference["qwen3"])
    assert usage["attention_impls"] == ["AscendAttentionImpl"]
    assert usage["facts"]["runner_class"].startswith("ascend_platform.worker.")
    assert usage["counts"]["attention.ascend.forward"] >= NUM_LAYERS
