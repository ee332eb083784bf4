"""The float64 W8A8 reference (`models.quantized_reference`) computes a checkpoint's integers exactly, the
conditioned checkpoints keep the unconditioned ones' folders, and the reference refuses what it does not cover."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import pytest
import torch

from ascend_testkit.models.quantized import DYNAMIC_CONDITIONING, QuantizedSpec, cached_quantized_llama
from ascend_testkit.models.quantized_reference import load_w8a8_float64
from ascend_testkit.models.tiny_llama import TinyModelSpec

BASE = TinyModelSpec(num_layers=1)


@pytest.fixture(scope="module")
def dynamic_checkpoint(tmp_path_factory):
    spec = QuantizedSpec(base=BASE, fmt="compressed-tensors", activations="dynamic", conditioning=DYNAMIC_CONDITIONING)
    return cached_quantized_llama(spec, tmp_path_factory.mktemp("models"))


def test_conditioning_is_part_of_the_key_only_when_set():
    plain = QuantizedSpec(base=BASE)
    fields = {k: v for k, v in asdict(plain).items() if k not in ("kv_cache", "conditioning")}
    assert plain.key() == hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    assert plain.key() != QuantizedSpec(base=BASE, conditioning=DYNAMIC_CONDITIONING).key()


def test_a_linear_computes_the_per_token_int8_products_exactly(dynamic_checkpoint):
    from safetensors.torch import load_file

    tensors = load_file(str(dynamic_checkpoint / "model.safetensors"))
    model = load_w8a8_float64(dynamic_checkpoint)
    name = "model.layers.0.mlp.down_proj"
    q, scale = tensors[f"{name}.weight"], tensors[f"{name}.weight_scale"].double()
    x = torch.randn(3, q.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4
    x[1] = 0  # an all-zero token stays zero
    xs = x.abs().amax(dim=-1, keepdim=True) / 127
    xq = torch.round(x / torch.where(xs > 0, xs, 1)).clamp(-128, 127)
    exact = (xq.long() @ q.long().t()).double() * xs * scale.reshape(1, -1)  # int64 sums: exact
    with torch.no_grad():
        out = dict(model.named_modules())[name](x)
    torch.testing.assert_close(out, exact, rtol=1e-12, atol=1e-12)
    assert (out[1] == 0).all()


def test_the_conditioned_embedding_is_what_the_checkpoint_holds(dynamic_checkpoint):
    from safetensors.torch import load_file

    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    float_dir = cached_tiny_llama(BASE, dynamic_checkpoint.parent)
    raw = load_file(str(float_dir / "model.safetensors"))["model.embed_tokens.weight"].double()
    held = load_file(str(dynamic_checkpoint / "model.safetensors"))["model.embed_tokens.weight"].double()
    torch.testing.assert_close(held, (raw * 100).bfloat16().double())


def test_a_checkpoint_that_is_not_compressed_tensors_is_refused_by_name(tmp_path):
    spec = QuantizedSpec(base=BASE, fmt="modelslim", activations="dynamic")
    folder = cached_quantized_llama(spec, tmp_path)
    with pytest.raises(ValueError, match="quantization_config is None"):
        load_w8a8_float64(folder)
