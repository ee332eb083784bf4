"""Vision-language models (tiny random Qwen2.5-VL and Qwen3-VL) served with images in the simulated-NPU lane, against
plain vLLM CPU on the same checkpoint: one batch of two images of different sizes (so different patch counts, windows
and image-token counts) and a text-only prompt, greedy tokens equal, on both model runners; and, for Qwen2.5-VL, one
OpenAI chat request with an `image_url` (data: URI) through `ascend-vllm serve` and the NPU kernel backend.

The vision tower's attention (vLLM's `MMEncoderAttention`; Qwen2.5-VL: block 0 windowed, block 1 full; Qwen3-VL:
full attention over interpolated position embeddings, with a DeepStack merger feeding the text model) runs through
the platform's out-of-tree `AscendMMEncoderAttention` and the kernel facade's `vision_attention`, and the text model's
through the ASCEND backend with its paged cache; the worker's usage counters say so. Plain vLLM CPU runs torch SDPA
for both.

The hosts run `allow_image_only_processor` first in every process (a `sitecustomize`): transformers 5.19 cannot build
any Qwen-VL processor without torchvision (its video processors need it), nor can vLLM import its Qwen-VL model file;
the shim gives both an image-only stand-in, the same for both lanes.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.counters import counter_delta
from ascend_testkit.models.vision_language import (
    IMAGE_PLACEHOLDER,
    TinyVisionLanguageSpec,
    cached_tiny_qwen2_5_vl,
    cached_tiny_qwen3_vl,
    image_data_uri,
    image_prompt,
    synthetic_image,
)

pytestmark = [pytest.mark.engine]

ENGINE = {"dtype": "float32", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 4, "block_size": 32,
          "limit_mm_per_prompt": {"image": 1, "video": 0}}
# Greedy tokens compared outright: no logprobs (vLLM V1's sampler compiles its logprobs gather with inductor, ~40 s
# per fresh host here, and these hosts are this module's own).
SAMPLING = {"max_tokens": 8}
VISION_DEPTH = TinyVisionLanguageSpec().vision_depth
NUM_LAYERS = TinyVisionLanguageSpec().num_layers
# (width, height, seed) of the two images
IMAGES = ((84, 56, 1), (112, 140, 2))
# Their image tokens per family. Qwen2.5-VL (14-pixel patches, 2x2 merged): 84x56 is 4x6 patches, 6 tokens; 112x140 is
# resized to 84x112 under max_pixels, 6x8 patches, 12 tokens. Qwen3-VL (16-pixel patches): 84x56 is resized to 96x64,
# 4x6 patches, 6 tokens; 112x140 to 128x128, 8x8 patches, 16 tokens.
IMAGE_TOKENS = {"qwen2_5_vl": (6, 12), "qwen3_vl": (6, 16)}
FAMILIES = {"qwen2_5_vl": cached_tiny_qwen2_5_vl, "qwen3_vl": cached_tiny_qwen3_vl}
RUNNERS = {"v1": "SimulatedModelRunnerV1", None: "SimulatedModelRunnerV2"}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def family_model(cache_root, family) -> str:
    return str(FAMILIES[family](cache_dir=cache_root / "models"))


@pytest.fixture(scope="module")
def model(cache_root) -> str:
    """Qwen2.5-VL: what the serving and NPU-backend tests run."""
    return str(cached_tiny_qwen2_5_vl(cache_dir=cache_root / "models"))


@pytest.fixture(scope="module")
def prompts() -> list:
    (w0, h0, s0), (w1, h1, s1) = IMAGES
    return [
        image_prompt("w1 w2", synthetic_image(w0, h0, s0), "w3 w4"),
        image_prompt("w9", synthetic_image(w1, h1, s1), "w5"),
        "w7 w8 w11 w12",
        # the first prompt's text with another image of its size: the image, not the text, decides its tokens
        image_prompt("w1 w2", synthetic_image(w0, h0, s0 + 10), "w3 w4"),
    ]


def _generate(host, model: str, prompts: list, usage: bool, max_tokens: int = SAMPLING["max_tokens"]
              ) -> tuple[list[dict], dict | None]:
    host.start(model, **ENGINE)
    try:
        before = dict(host.usage()[0]["counts"]) if usage else {}
        outputs = host.generate(prompts, **{**SAMPLING, "max_tokens": max_tokens})["outputs"]
        report = None
        if usage:
            after = host.usage()[0]
            report = {"delta": counter_delta(after["counts"], before),
                      "runner": after["facts"]["runner_class"], "impls": after["attention_impls"]}
    finally:
        host.stop()
    return outputs, report


@pytest.fixture(scope="module")
def reference(image_only_host, family_model, prompts) -> list[dict]:
    """Plain vLLM CPU (V1, torch SDPA in the vision tower, its CPU attention in the text model)."""
    outputs, _ = _generate(image_only_host("vl-cpu", "cpu", "v1"), family_model, prompts, usage=False)
    return outputs


def test_reference_reads_the_images(reference, family):
    """The comparison below says something: the image tokens are there, and an image changes the output."""
    lengths = [len(o["prompt_token_ids"]) for o in reference]
    first, second = IMAGE_TOKENS[family]
    assert lengths[0] == 6 + first and lengths[1] == 4 + second and lengths[2] == 4, lengths
    assert reference[0]["token_ids"] != reference[3]["token_ids"]


@pytest.mark.parametrize("runner", list(RUNNERS), ids=["v1", "mrv2"])
def test_images_through_our_vision_attention_equal_vllm_cpu(image_only_host, family_model, prompts, reference,
                                                            runner):
    host = image_only_host(f"vl-sim-{runner or 'default'}", "simulated", runner)
    ours, report = _generate(host, family_model, prompts, usage=True)
    assert [o["prompt_token_ids"] for o in ours] == [o["prompt_token_ids"] for o in reference]
    assert [o["token_ids"] for o in ours] == [o["token_ids"] for o in reference]
    assert report["runner"].endswith(RUNNERS[runner])
    delta = report["delta"]
    # every vision block of every encoder call went through our op, none through vLLM's SDPA
    assert delta.get("attention.ascend.vision.forward", 0) >= VISION_DEPTH, delta
    assert delta["kernels.vision_attention"] == delta["attention.ascend.vision.forward"]
    assert not [k for k in delta if k.startswith("attention.ascend.vision.upstream")], delta
    # the text model's attention is ours as for any decoder
    assert report["impls"] == ["AscendAttentionImpl"]
    assert delta.get("kernels.paged_attention", 0) >= NUM_LAYERS * SAMPLING["max_tokens"]


SERVE_PORT = 8395  # inside the session's loopback-only namespace
SERVED_TOKENS = 6


def test_image_url_chat_through_ascend_vllm_serve(tmp_path, netns, model, image_only_env, image_only_host):
    """`ascend-vllm serve` (simulated lane, its default runner: MRV2) answers an OpenAI chat request whose image is
    an `image_url` data: URI with plain vLLM CPU's greedy text for the same rendered prompt and image, and its
    worker says the vision tower's attention went through our op."""
    import json
    import urllib.request

    from ascend_testkit.servers import inside, start_serve

    image = synthetic_image(84, 56, seed=3)
    uri = image_data_uri(image)
    args = ["--dtype", "float32", "--max-model-len", "512", "--enforce-eager", "--max-num-seqs", "4",
            "--served-model-name", "tiny-vl", "--seed", "0", "--limit-mm-per-prompt", '{"image": 1, "video": 0}']
    server = start_serve("vl", model, SERVE_PORT, log_dir=tmp_path, cpu=None, netns=netns, args=args,
                         env_extra={"VLLM_SERVER_DEV_MODE": "1", **image_only_env})
    try:
        server.wait_healthy()
        with inside(netns):
            client = server.openai_client()
            reply = client.chat.completions.create(
                model="tiny-vl", max_tokens=SERVED_TOKENS, temperature=0.0,
                messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": uri}},
                                                       {"type": "text", "text": "w5 w6"}]}])
            req = urllib.request.Request(server.url + "/collective_rpc", method="POST",
                                         data=json.dumps({"method": "ascend_usage"}).encode(),
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as resp:
                usage = json.loads(resp.read())["results"][0]
    finally:
        server.close()
    # the chat template's rendering of that message, through plain vLLM CPU with the same image
    rendered = f"<|im_start|>user\n{IMAGE_PLACEHOLDER} w5 w6 <|im_end|>\n<|im_start|>assistant\n"
    cpu = image_only_host("vl-cpu", "cpu", "v1")
    want, _ = _generate(cpu, model, [{"prompt": rendered, "multi_modal_data": {"image": uri}}], usage=False,
                        max_tokens=SERVED_TOKENS)
    assert reply.usage.prompt_tokens == len(want[0]["prompt_token_ids"])
    assert reply.choices[0].message.content == want[0]["text"]
    assert want[0]["text"].strip(), "the reference answered nothing: the comparison would say nothing"
    assert usage["counts"].get("attention.ascend.vision.forward", 0) >= VISION_DEPTH
    assert usage["counts"]["kernels.vision_attention"] == usage["counts"]["attention.ascend.vision.forward"]


# The NPU backend (the testkit's schema-faithful torch_npu, the card's documented limits): bfloat16, as torch_npu's
# attention takes it, and 128-token blocks, as its paged prompt attention takes them.
NPU_ENGINE = ENGINE | {"dtype": "bfloat16", "block_size": 128}
NPU_BACKENDS = {"npu": {"kernel_backend": "npu", "kernel_checks": True}, "auto": {"kernel_checks": True}}


def test_npu_binding_serves_the_vision_tower_like_the_reference_kernels(image_only_host, model, prompts):
    """The same batch with `kernel_backend="npu"`: the vision blocks' attention is torch_npu's FIA in TND (head dim
    16 padded to 128) through the schema-faithful fake, nothing falls back, and the greedy tokens are the reference
    kernels' in the same lane and dtype (up to a bfloat16 near-tie: `check_logprobs_close`)."""
    # MRV2 (the lane's default): its logprobs are the facade's; V1's sampler compiles them with inductor (~1 min)
    host = image_only_host("vl-npu", "simulated", None, {"ASCEND_TESTKIT_TORCH_NPU": "1"})
    runs = {}
    for backend, config in NPU_BACKENDS.items():
        host.start(model, **NPU_ENGINE, additional_config=config)
        try:
            before = host.usage()[0]
            outputs = host.generate(prompts, **SAMPLING, logprobs=5)["outputs"]
            after = host.usage()[0]
        finally:
            host.stop()
        runs[backend] = {"outputs": outputs, "facts": after["facts"],
                         **{key: counter_delta(after[key], before[key]) for key in ("counts", "npu_ops", "fallbacks")}}
    npu, ref = runs["npu"], runs["auto"]
    assert npu["facts"]["kernel_backend"] == "npu" and ref["facts"]["kernel_backend"] == "reference"
    assert npu["fallbacks"] == {}, npu
    assert npu["counts"]["attention.ascend.vision.forward"] >= VISION_DEPTH
    # one FIA call per vision block (the text model's paged attention is FIA v2)
    assert npu["npu_ops"].get("npu_fused_infer_attention_score", 0) == npu["counts"]["attention.ascend.vision.forward"]
    assert [o["prompt_token_ids"] for o in npu["outputs"]] == [o["prompt_token_ids"] for o in ref["outputs"]]
    # bfloat16 through two sets of kernels: identical tokens, or at the first divergence each in the other's top-5
    check_logprobs_close(npu["outputs"], ref["outputs"], name_0="npu kernels", name_1="reference kernels")
