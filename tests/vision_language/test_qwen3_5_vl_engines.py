"""Qwen3.5 with its vision tower (a tiny random `Qwen3_5ForConditionalGeneration`: the dense hybrid text model of
`tests/hybrid`, gated delta-net and gated full attention layers, under a Qwen3-VL-like tower) served with images in
the simulated-NPU lane (its default runner, MRV2), against plain vLLM CPU on the same checkpoint: two images of
different sizes and a text prompt in one batch.

Ours runs the vision blocks' attention through `vision_attention`, the GDN layers' core on the kernel facade's GDN
ops with their states in our allocator, and the full attention through the ASCEND backend; plain vLLM CPU runs its
own. bf16 (vLLM CPU's GDN layer takes nothing else), so the lanes are compared as vLLM's model tests compare them
(`check_logprobs_close`). The hosts run the image-only processor shim (see `test_qwen_vl_engines.py`). In bf16 the
tower's position-embedding Triton kernel is one Triton's interpreter gets wrong (inf embeddings, token 0 out before
the simulated lane ran vLLM's eager twin in its place): this module is the proof of that stand-in.
"""

from __future__ import annotations

import pytest

from ascend_testkit.compare import check_logprobs_close
from ascend_testkit.counters import counter_delta
from ascend_testkit.models.hybrid import TinyHybridSpec
from ascend_testkit.models.vision_language import (
    TinyQwen3VLSpec,
    cached_tiny_qwen3_5_vl,
    image_prompt,
    synthetic_image,
    token_ids,
)

pytestmark = [pytest.mark.engine]

ENGINE = {"dtype": "bfloat16", "max_model_len": 512, "enforce_eager": True, "max_num_seqs": 4,
          "limit_mm_per_prompt": {"image": 1, "video": 0}}
SAMPLING = {"max_tokens": 8, "logprobs": 5}
GDN_LAYERS = TinyHybridSpec().layer_types.count("linear_attention")
VISION_DEPTH = TinyQwen3VLSpec().vision_depth
IMAGE_PAD = token_ids(TinyQwen3VLSpec(vocab_size=TinyHybridSpec().vocab_size))["<|image_pad|>"]


@pytest.fixture(scope="module")
def model(cache_root) -> str:
    return str(cached_tiny_qwen3_5_vl(cache_dir=cache_root / "models"))


@pytest.fixture(scope="module")
def prompts() -> list:
    # 84x56 is 6 image tokens, 112x140 16 (Qwen3-VL's 16-pixel patches, 2x2 merged)
    return [image_prompt("w1 w2", synthetic_image(84, 56, 1), "w3 w4"),
            image_prompt("w9", synthetic_image(112, 140, 2), "w5"),
            "w7 w8 w11 w12",
            image_prompt("w1 w2", synthetic_image(84, 56, 11), "w3 w4")]


def _run(host, model: str, prompts: list, usage: bool) -> dict:
    host.start(model, **ENGINE)
    try:
        before = host.usage()[0]["counts"] if usage else {}
        outputs = host.generate(prompts, **SAMPLING)["outputs"]
        after = host.usage()[0]["counts"] if usage else {}
    finally:
        host.stop()
    return {"outputs": outputs, "delta": counter_delta(after, before)}


@pytest.fixture(scope="module")
def reference(image_only_host, model, prompts) -> dict:
    return _run(image_only_host("vl-qwen3_5-cpu", "cpu", "v1"), model, prompts, usage=False)


@pytest.fixture(scope="module")
def ours(image_only_host, model, prompts) -> dict:
    return _run(image_only_host("vl-qwen3_5-sim", "simulated", None), model, prompts, usage=True)


def test_reference_reads_the_images(reference):
    outputs = reference["outputs"]
    assert [o["prompt_token_ids"].count(IMAGE_PAD) for o in outputs] == [6, 16, 0, 6]
    assert outputs[0]["token_ids"] != outputs[3]["token_ids"]  # the image, not the text, decides


def test_qwen3_5_with_images_equals_plain_vllm_cpu(ours, reference):
    assert [o["prompt_token_ids"] for o in ours["outputs"]] == [o["prompt_token_ids"] for o in reference["outputs"]]
    check_logprobs_close(ours["outputs"], reference["outputs"], name_0="simulated NPU", name_1="vLLM CPU")
    delta = ours["delta"]
    assert delta.get("attention.ascend.vision.forward", 0) >= VISION_DEPTH, delta
    assert not [k for k in delta if k.startswith("attention.ascend.vision.upstream")], delta
    prompt_tokens = sum(len(o["prompt_token_ids"]) for o in ours["outputs"])
    assert delta.get("gdn.prefill_tokens", 0) >= GDN_LAYERS * prompt_tokens, delta
    assert delta.get("gdn.decode_tokens", 0) >= GDN_LAYERS * (SAMPLING["max_tokens"] - 1) * len(ours["outputs"])
    assert delta.get("kernels.paged_attention", 0) > 0, delta
    # Triton's interpreter (on in this lane's MRV2) computes the tower's bfloat16 position-embedding kernel wrong;
    # its eager twin ran instead (`ascend_platform.simulated.model_kernels`)
    assert delta.get("mrv2_kernels.bilinear_pos_embed", 0) >= 2, delta
