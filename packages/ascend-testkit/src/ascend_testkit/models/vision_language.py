"""Tiny random Qwen2.5-VL and Qwen3-VL checkpoints built on the spot, with processors that load offline.

The checkpoint is a `Qwen2_5_VLForConditionalGeneration` (vLLM's `qwen2_5_vl.py`): a two-block vision tower (block 0
windowed attention, block 1 full attention, as `fullatt_block_indexes` says) whose 2x2-merged patches become image
tokens of a two-layer Qwen2 text model with M-RoPE. Dims are the smallest that stay valid: vision head dim 16 (its
rotary covers half of it, as Qwen2.5-VL's does), text head dim 32 (a size vLLM's CPU attention takes), M-RoPE
sections (t, h, w) = (4, 6, 6) summing to head_dim / 2.

The processor is Qwen2.5-VL's own (`Qwen2_5_VLProcessor`): the PIL image processor (patch 14, merge 2, pixels capped
so a test image is a few dozen patches) and a word-level tokenizer (`word_tokenizer`'s `w0 … wN`, one token per
word) that also knows Qwen's special tokens as added tokens, so `<|vision_start|><|image_pad|><|vision_end|>` splits
into their ids without spaces. A chat template renders OpenAI image parts as that placeholder (what
`ascend-vllm serve` applies to an `image_url` message). Its video processor is named `ImageOnlyVideoProcessor`, which
`allow_image_only_processor` registers where torchvision is missing (see there).

The Qwen3-VL (`Qwen3VLForConditionalGeneration`, vLLM's `qwen3_vl.py`) shares the text shape, tokenizer and chat
template; its vision tower has 16-pixel patches, learned position embeddings interpolated to each image's grid and a
DeepStack merger, and its text model interleaves the M-RoPE sections.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import built_once, default_cache_dir
from ascend_testkit.models.hybrid import TinyHybridSpec, _hybrid_config_kwargs, random_gdn_model
from ascend_testkit.models.tiny_llama import TinyModelSpec
from ascend_testkit.models.word_tokenizer import SPECIALS, word

# Qwen's special tokens, after the word vocabulary; the config's token ids point at them.
QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|image_pad|>", "<|video_pad|>")
ROLE_WORDS = ("system", "user", "assistant")
IMAGE_PLACEHOLDER = "<|vision_start|><|image_pad|><|vision_end|>"
PATCH_SIZE = 14
QWEN3_VL_PATCH_SIZE = 16
MERGE_SIZE = 2

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] in ('image', 'image_url') %}" + IMAGE_PLACEHOLDER + " "
    "{% elif part['type'] == 'text' %}{{ part['text'] }} {% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass(frozen=True)
class TinyVisionLanguageSpec(TinyModelSpec):
    """The tiny Llama's text shape plus a vision tower's; `vocab_size` counts the word vocabulary only (the role
    words and Qwen's specials come after it)."""

    vision_depth: int = 2
    vision_hidden_size: int = 32
    vision_heads: int = 2  # head dim 16
    vision_intermediate_size: int = 64
    window_size: int = 56  # 56 / merge 2 / patch 14 = windows of 2x2 merged patches
    mrope_section: tuple[int, int, int] = (4, 6, 6)  # t, h, w: sums to head_dim / 2
    max_pixels: int = 112 * 112  # at most 64 patches (16 image tokens) per image
    min_pixels: int = 28 * 28
    initializer_range: float = 0.5


def token_ids(spec: TinyVisionLanguageSpec) -> dict[str, int]:
    """Every non-word token's id in the tokenizer (words are `w<i>` at `len(SPECIALS) + i`)."""
    return {tok: spec.vocab_size + i for i, tok in enumerate((*ROLE_WORDS, *QWEN_SPECIALS))}


def _save_tokenizer(path: Path, spec: TinyVisionLanguageSpec) -> None:
    from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS)}
    for i in range(spec.vocab_size - len(SPECIALS)):
        vocab[word(i)] = len(vocab)
    for tok, i in token_ids(spec).items():
        vocab[tok] = i
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN_SPECIALS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)


def _vocab_total(spec: TinyVisionLanguageSpec) -> int:
    return spec.vocab_size + len(ROLE_WORDS) + len(QWEN_SPECIALS)


def _text_config(spec: TinyVisionLanguageSpec, **extra) -> dict:
    ids = token_ids(spec)
    rope = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": list(spec.mrope_section)}
    return {
        "vocab_size": _vocab_total(spec),
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "max_position_embeddings": spec.max_position_embeddings,
        "initializer_range": spec.initializer_range,
        "rope_parameters": rope | extra.pop("rope", {}),
        "bos_token_id": 1,
        "eos_token_id": ids["<|im_end|>"],
        "pad_token_id": ids["<|endoftext|>"],
        **extra,
    }


def _vision_config(spec: TinyVisionLanguageSpec, patch_size: int, **extra) -> dict:
    return {
        "depth": spec.vision_depth,
        "hidden_size": spec.vision_hidden_size,
        "intermediate_size": spec.vision_intermediate_size,
        "num_heads": spec.vision_heads,
        "patch_size": patch_size,
        "spatial_merge_size": MERGE_SIZE,
        "temporal_patch_size": 2,
        "out_hidden_size": spec.hidden_size,
        "initializer_range": spec.initializer_range,
        **extra,
    }


def _vision_token_ids(spec: TinyVisionLanguageSpec) -> dict:
    ids = token_ids(spec)
    return {"image_token_id": ids["<|image_pad|>"], "video_token_id": ids["<|video_pad|>"],
            "vision_start_token_id": ids["<|vision_start|>"], "vision_end_token_id": ids["<|vision_end|>"],
            "tie_word_embeddings": False, "torch_dtype": "float32"}


def _save_byte_level_tokenizer(path: Path, spec: TinyVisionLanguageSpec) -> None:
    """A byte-level BPE in the shape of Qwen3.5's own: transformers builds `Qwen3_5Tokenizer` for a `qwen3_5` model
    from the file's vocab and merges whatever class the file names, and a word-level vocabulary comes out of it as no
    tokens at all. The 256 byte symbols, one merge ("Ġw"), Qwen's specials at `token_ids(spec)`. Qwen's pre-tokenizer
    cuts digits one by one, so the word `w12` after a space is three tokens ("Ġw", "1", "2")."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {symbol: i for i, symbol in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["Ġw"] = len(vocab)
    specials = {tok: i for tok, i in token_ids(spec).items() if tok in QWEN_SPECIALS}
    tok = Tokenizer(models.BPE(vocab=vocab | specials, merges=[("Ġ", "w")]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.save_pretrained(path)


def _save(path: Path, spec: TinyVisionLanguageSpec, model, image_processor, video_processor: dict,
          save_tokenizer=_save_tokenizer) -> Path:
    """The seeded random model, the tokenizer, the PIL image processor, the image-only video processor's config (the
    type `allow_image_only_processor` registers: Qwen-VL's own need torchvision) and the chat template."""
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path, spec)
    image_processor.save_pretrained(path)
    (path / "video_preprocessor_config.json").write_text(json.dumps(
        {"video_processor_type": "ImageOnlyVideoProcessor", "merge_size": MERGE_SIZE, "temporal_patch_size": 2,
         **video_processor}, indent=2))
    (path / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    return path


def build_tiny_qwen2_5_vl(path: str | os.PathLike, spec: TinyVisionLanguageSpec = TinyVisionLanguageSpec()) -> Path:
    import torch
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vision = _vision_config(spec, PATCH_SIZE, window_size=spec.window_size,
                            fullatt_block_indexes=[spec.vision_depth - 1])
    config = Qwen2_5_VLConfig(text_config=_text_config(spec), vision_config=vision, **_vision_token_ids(spec))
    torch.manual_seed(spec.seed)
    image_processor = Qwen2VLImageProcessorPil(
        patch_size=PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2,
        min_pixels=spec.min_pixels, max_pixels=spec.max_pixels,
    )
    return _save(path, spec, Qwen2_5_VLForConditionalGeneration(config), image_processor,
                 {"patch_size": PATCH_SIZE})


@dataclass(frozen=True)
class TinyQwen3VLSpec(TinyVisionLanguageSpec):
    """Qwen3-VL's shape, tiny: 16-pixel patches, learned position embeddings interpolated to each image's grid (an 8 x 8
    table), a DeepStack merger after vision block 0 whose features are added to the first text layer's hidden states,
    interleaved M-RoPE; head dims as the Qwen2.5-VL spec's (vision 16, text 32)."""

    num_position_embeddings: int = 64
    deepstack_visual_indexes: tuple[int, ...] = (0,)
    max_pixels: int = 128 * 128  # at most 64 patches (16 image tokens) per image
    min_pixels: int = 32 * 32


def build_tiny_qwen3_vl(path: str | os.PathLike, spec: TinyQwen3VLSpec = TinyQwen3VLSpec()) -> Path:
    import torch
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    text = _text_config(spec, head_dim=spec.hidden_size // spec.num_heads, rope={"mrope_interleaved": True})
    vision = _vision_config(spec, QWEN3_VL_PATCH_SIZE, num_position_embeddings=spec.num_position_embeddings,
                            deepstack_visual_indexes=list(spec.deepstack_visual_indexes))
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **_vision_token_ids(spec))
    torch.manual_seed(spec.seed)
    return _save(path, spec, Qwen3VLForConditionalGeneration(config), *_qwen3_vl_processors(spec))


def _qwen3_vl_processors(spec: TinyQwen3VLSpec) -> tuple[object, dict]:
    """Qwen3-VL's PIL image processor and the image-only video processor's config."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=QWEN3_VL_PATCH_SIZE, merge_size=MERGE_SIZE, temporal_patch_size=2,
        size={"shortest_edge": spec.min_pixels, "longest_edge": spec.max_pixels},
        image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
    )
    # vLLM sizes Qwen3-VL's video budget from the video processor's `size` even with no videos allowed (its pixel
    # cap counts the 2 frames a temporal patch merges)
    video = {"patch_size": QWEN3_VL_PATCH_SIZE, "fps": 2, "min_frames": 4, "max_frames": 8,
             "size": {"shortest_edge": 2 * spec.min_pixels, "longest_edge": 2 * spec.max_pixels}}
    return image_processor, video


def build_tiny_qwen3_5_vl(path: str | os.PathLike, spec: TinyHybridSpec | None = None) -> Path:
    """Qwen3.5 with its vision tower (`Qwen3_5ForConditionalGeneration`): the tiny dense Qwen3.5 text model
    (`hybrid.TinyHybridSpec`: gated delta-net and gated full attention layers, bf16) under Qwen3-VL's tower without
    DeepStack, its M-RoPE interleaved over the partial rotary dims (a quarter of the 256-wide heads: sections 12 + 10
    + 10 = 32 pairs), and a byte-level tokenizer (`_save_byte_level_tokenizer`: the word tokenizer cannot serve a
    `qwen3_5` model)."""
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    spec = spec or TinyHybridSpec()
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    vl = TinyQwen3VLSpec(hidden_size=spec.hidden_size, vocab_size=spec.vocab_size)
    ids = token_ids(vl)
    text = _hybrid_config_kwargs(spec) | {
        "vocab_size": _vocab_total(vl), "eos_token_id": ids["<|im_end|>"], "pad_token_id": ids["<|endoftext|>"],
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                            "mrope_section": [12, 10, 10], "mrope_interleaved": True}}
    vision = _vision_config(vl, QWEN3_VL_PATCH_SIZE, num_position_embeddings=vl.num_position_embeddings)
    config = Qwen3_5Config(text_config=text, vision_config=vision, **_vision_token_ids(vl))
    config.architectures = [Qwen3_5ForConditionalGeneration.__name__]
    torch.manual_seed(spec.seed)
    return _save(path, vl, random_gdn_model(Qwen3_5ForConditionalGeneration, config), *_qwen3_vl_processors(vl),
                 save_tokenizer=_save_byte_level_tokenizer)


def cached_tiny_qwen3_5_vl(spec: TinyHybridSpec | None = None, cache_dir: str | os.PathLike | None = None) -> Path:
    spec = spec or TinyHybridSpec()
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3_5_vl-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_5_vl(tmp, spec))


def cached_tiny_qwen3_vl(spec: TinyQwen3VLSpec = TinyQwen3VLSpec(), cache_dir: str | os.PathLike | None = None
                         ) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen3_vl-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen3_vl(tmp, spec))


def cached_tiny_qwen2_5_vl(
    spec: TinyVisionLanguageSpec = TinyVisionLanguageSpec(), cache_dir: str | os.PathLike | None = None
) -> Path:
    folder = Path(cache_dir or default_cache_dir()) / f"tiny-qwen2_5_vl-{spec.key()}"
    return built_once(folder, lambda tmp: build_tiny_qwen2_5_vl(tmp, spec))


def synthetic_image(width: int, height: int, seed: int = 0):
    """A PIL RGB image of random pixels (a fixed seed: the same image in every process)."""
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels, mode="RGB")


def allow_image_only_processor() -> None:
    """Let this process build Qwen2.5-VL's HF processor without torchvision, for images only.

    transformers 5.19 gives every Qwen-VL processor a video processor, and its video processors are torchvision-only
    (absent here: torchvision does not load beside vLLM CPU's torch build), so the processor cannot be built and
    neither plain vLLM nor ours starts the model. This registers the checkpoint's `video_processor_type`
    (`ImageOnlyVideoProcessor`, a `BaseVideoProcessor` that refuses videos) with transformers' video auto-mapping, and
    names that base as the class a processor's video attribute must be. A no-op where torchvision is installed.
    Run it first in every process that builds the processor (an engine host's `setup`, the served API process's
    `sitecustomize`); it changes no engine code, ours or vLLM's."""
    import transformers
    from transformers.utils import is_torchvision_available

    if is_torchvision_available() or getattr(transformers, "_ascend_image_only_video", False):
        return
    import importlib
    import sys

    # vLLM's qwen2_vl.py (and through qwen3_vl, qwen3_5.py: the Qwen3.5 text models too) imports `smart_resize` from
    # the torchvision image processor's module; the PIL one's is the same function.
    pil = importlib.import_module("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    sys.modules.setdefault("transformers.models.qwen2_vl.image_processing_qwen2_vl", pil)

    from transformers import Qwen2_5_VLConfig
    from transformers.video_processing_utils import BaseVideoProcessor

    # the module itself: `from transformers.models.auto import ...` hands out a torchvision-requiring dummy
    video_processing_auto = importlib.import_module("transformers.models.auto.video_processing_auto")

    class ImageOnlyVideoProcessor(BaseVideoProcessor):
        merge_size = MERGE_SIZE
        temporal_patch_size = 2
        patch_size = PATCH_SIZE

        def preprocess(self, videos, **kwargs):
            raise ValueError("this tiny Qwen2.5-VL serves images only (no torchvision for a video processor)")

    video_processing_auto.VIDEO_PROCESSOR_MAPPING.register(
        Qwen2_5_VLConfig, {"torchvision": ImageOnlyVideoProcessor}, exist_ok=True)
    # the class `ProcessorMixin` holds a processor's video attribute to (looked up on its own transformers module)
    processing_utils = importlib.import_module("transformers.processing_utils")
    for module in {transformers, processing_utils.transformers_module}:
        module.VideoProcessorMixin = BaseVideoProcessor
    transformers._ascend_image_only_video = True


SITECUSTOMIZE = (
    "# written by ascend_testkit.models.vision_language.image_only_env: every Python process of this environment\n"
    "from ascend_testkit.models.vision_language import allow_image_only_processor\n"
    "allow_image_only_processor()\n"
)


def image_only_env(folder: str | os.PathLike, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment variables that run `allow_image_only_processor` first in every Python process started with them
    (a `sitecustomize` in `folder`, put first on PYTHONPATH): vLLM inspects a model class in a subprocess of its own,
    and a served engine builds the processor in its API process, neither of which a test can reach otherwise."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(SITECUSTOMIZE)
    current = (base if base is not None else os.environ).get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(folder), current) if p)}


def image_prompt(text_before: str, image, text_after: str) -> dict:
    """An engine host's prompt of `image` between two texts, the image as a data: URI."""
    return {"prompt": f"{text_before} {IMAGE_PLACEHOLDER} {text_after}",
            "multi_modal_data": {"image": image_data_uri(image)}}


def image_data_uri(image) -> str:
    """`image` as a PNG `data:` URI: OpenAI's `image_url` form, and how an engine host's prompt carries an image."""
    import base64
    import io

    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
