"""The tiny V4.1 checkpoint is what vLLM 0.32's V4.1 config class and weight mapper take."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_testkit.models.deepseek_v41 import TinyDeepseekV41Spec, cached_tiny_deepseek_v41


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return cached_tiny_deepseek_v41(cache_dir=tmp_path_factory.mktemp("v41"))


def _tensor_names(model_dir: Path) -> dict[str, str]:
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        return {k: str(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118 (safe_open is not iterable)


def test_vllm_parses_the_config_with_its_v41_class(model_dir):
    from vllm.transformers_utils.config import get_config
    from vllm.transformers_utils.configs.deepseek_v41 import DeepseekV41Config

    config = get_config(str(model_dir), trust_remote_code=False)
    assert isinstance(config, DeepseekV41Config)
    assert config.architectures == ["DeepseekV41ForCausalLM"]
    assert config.vision_n_layers == 0
    assert (config.head_dim, config.qk_rope_head_dim, config.index_head_dim) == (512, 64, 128)
    assert config.compress_ratios == [0, 0, 2, 2, 1, 1]
    assert config.kv_source_layer_ids == [2, 4] and config.index_source_layer_ids == [2, 4, 5]
    assert (config.candidate_source_layer_id, config.candidate_topk_blocks) == (4, 3)
    assert config.num_hidden_layers == 6 and config.hidden_size == 64


def test_engram_layout_and_compressed_vocab_match_vllms(model_dir):
    from transformers import AutoTokenizer
    from vllm.models.deepseek_v41.common.engram import EngramLayout, build_compressed_token_map
    from vllm.transformers_utils.config import get_config

    config = get_config(str(model_dir), trust_remote_code=False)
    _, size = build_compressed_token_map(AutoTokenizer.from_pretrained(model_dir))
    assert config.engram_compressed_vocab_size == size
    layout = EngramLayout.from_config(config)
    assert layout.layer_ids == (1, 4)
    names = _tensor_names(model_dir)
    for i, layer in enumerate(layout.layer_ids):
        rows = sum(sum(p) for p in layout.primes[i])
        assert layout.num_embeddings[i] == rows
        from safetensors import safe_open

        with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
            assert list(f.get_slice(f"layers.{layer}.engram.embed.weight").get_shape()) == [rows, layout.head_dim]
            assert list(f.get_slice(f"layers.{layer}.engram.embed.scale").get_shape()) == [rows, layout.head_dim // 32]
        assert names[f"layers.{layer}.engram.embed.weight"] == "F8_E4M3"
        assert names[f"layers.{layer}.engram.embed.scale"] == "F8_E8M0"


def test_every_tensor_maps_to_a_vllm_v41_parameter_name(model_dir):
    """vLLM's V4.1 mapper renames each release name to a parameter of its text model (the stacked / expert / engram
    names as DeepseekV4Model.load_weights resolves them)."""
    from vllm.models.deepseek_v41.nvidia.model import _make_deepseek_v4_weights_mapper

    mapper = _make_deepseek_v4_weights_mapper("fp8")
    names = _tensor_names(model_dir)
    mapped = {mapper.map_name(n) for n in names}
    assert None not in mapped
    assert "model.embed_tokens.weight" in mapped and "lm_head.weight" in mapped
    assert "model.layers.1.engram.embed_tokens.weight" in mapped
    assert "model.layers.1.engram.embed_tokens.weight_scale_inv" in mapped
    assert "model.layers.2.attn.compressor.wgate.weight" in mapped
    assert "model.layers.4.attn.compressor.wgate.weight" not in mapped  # ratio 1: no gate
    assert "model.layers.5.attn.indexer.wq_b.weight" in mapped
    assert "model.layers.5.attn.indexer.wk.weight" not in mapped  # keys come from layer 4's
    assert "model.layers.3.attn.compressor.wkv.weight" not in mapped  # not a KV source
    assert "model.layers.0.ffn.gate.e_score_correction_bias" in mapped
    assert not any("hc_head" in n for n in mapped)  # V4.1 has no learned head collapse


def test_engram_and_candidates_turn_off(tmp_path):
    model_dir = cached_tiny_deepseek_v41(cache_dir=tmp_path, engram_layer_ids=(), candidate_source_layer_id=None)
    text = json.loads((model_dir / "config.json").read_text())["text_config"]
    assert text["engram_layer_ids"] == [] and text["candidate_source_layer_id"] == -1
    assert text["candidate_topk_blocks"] == 0
    assert not any(".engram." in n for n in _tensor_names(model_dir))
    from vllm.models.deepseek_v41.common.engram import EngramLayout
    from vllm.transformers_utils.config import get_config

    assert EngramLayout.from_config(get_config(str(model_dir), trust_remote_code=False)) is None


def test_spec_refuses_a_topology_vllm_cannot_serve():
    with pytest.raises(ValueError, match="ratio"):
        TinyDeepseekV41Spec(compress_ratios=(0, 4)).validate()
    with pytest.raises(ValueError, match="source"):
        TinyDeepseekV41Spec(compress_ratios=(0, 1), kv_source_layer_ids=(), index_source_layer_ids=(1,),
                            candidate_source_layer_id=None, engram_layer_ids=()).validate()
    with pytest.raises(ValueError, match="candidate_block_size"):
        TinyDeepseekV41Spec(candidate_topk_blocks=2, candidate_block_size=4, index_topk=8).validate()
