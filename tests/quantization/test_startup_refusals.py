"""What a quantized model cannot be served with is refused at start-up, naming the tensor, layer or type."""

from __future__ import annotations

import json
import shutil

import pytest

pytestmark = pytest.mark.engine

DESCRIPTION = "quant_model_description.json"


def _edited(tmp_path, source: str, edit) -> str:
    folder = tmp_path / "checkpoint"
    shutil.copytree(source, folder)
    description = json.loads((folder / DESCRIPTION).read_text())
    edit(description)
    (folder / DESCRIPTION).write_text(json.dumps(description))
    return str(folder)


def _start_error(quant_hosts, model: str) -> str:
    error = quant_hosts("v1").start_error(model, **quant_hosts.engine)
    assert error is not None, f"{model} started"
    return error["message"]


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


def _types(names, kind):
    return lambda d: d.update({k: kind for k in d if any(k.startswith(n + ".") for n in names)})


def test_unsupported_expert_type_is_refused_naming_the_layer(quant_hosts, cache_root, tmp_path):
    """A ModelSlim description marking a Qwen3-MoE's experts W8A16 (a type served for linears, not for experts):
    refused when the routed experts are built, before any weight loads. First in this module: a refused start
    leaves the host's parallel groups as that engine made them, and only a MoE engine creates the EP group."""
    from ascend_testkit.models.quantized_moe import QuantizedMoeSpec, cached_quantized_moe

    source = cached_quantized_moe(QuantizedMoeSpec(), cache_root / "models")
    folder = _edited(tmp_path, str(source), lambda d: d.update(
        {k: "W8A16" for k, v in d.items() if ".mlp.experts." in k and v == "W8A8_DYNAMIC"}))
    message = _start_error(quant_hosts, folder)
    assert ("layer 'model.layers.0.mlp.experts'" in message and "has expert type 'W8A16'; served expert types: "
            "W8A8_DYNAMIC, W4A8_DYNAMIC, FLOAT" in message), message


def test_unsupported_compressed_tensors_expert_scheme_is_refused_by_name(quant_hosts, cache_root, tmp_path):
    """The compressed-tensors int8 MoE twin with static per-tensor activations: vLLM's config parses it, our
    platform serves dynamic per-token int8 experts only and refuses it naming the layer and the scheme."""
    from ascend_testkit.models.quantized_moe import QuantizedMoeSpec, cached_quantized_moe

    source = cached_quantized_moe(QuantizedMoeSpec(fmt="compressed-tensors"), cache_root / "models")
    folder = tmp_path / "ct-static"
    shutil.copytree(source, folder)
    config = json.loads((folder / "config.json").read_text())
    acts = config["quantization_config"]["config_groups"]["group_0"]["input_activations"]
    acts.update(strategy="tensor", dynamic=False, observer="minmax")
    (folder / "config.json").write_text(json.dumps(config))
    message = _start_error(quant_hosts, str(folder))
    assert "compressed-tensors layer 'model.layers.0.mlp.experts': expert scheme (weights 8-bit int" in message, message
    assert "input activations 8-bit int tensor static)" in message, message


def test_another_quantization_method_is_refused_by_name(quant_hosts, quant_models):
    """vLLM's own check against the platform's `supported_quantization` (ascend, compressed-tensors) refuses it."""
    error = quant_hosts("v1").start_error(quant_models["ms_dynamic"], quantization="fp8", **quant_hosts.engine)
    assert error is not None, "fp8 started"
    assert "fp8 quantization is currently not supported in" in error["message"], error["message"]


CASES = {
    "described tensor missing": (_set("model.layers.0.mlp.down_proj.smooth_scale", "W8A8_DYNAMIC"),
                                 "names tensor 'model.layers.0.mlp.down_proj.smooth_scale', which the checkpoint "
                                 "in"),
    "stored tensor undescribed": (lambda d: d.pop("model.layers.1.self_attn.o_proj.weight_offset"),
                                  "the checkpoint has tensor 'model.layers.1.self_attn.o_proj.weight_offset', which "
                                  "quant_model_description.json does not name"),
    "unsupported linear type": (_types([f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")],
                                       "W4A8_DYNAMIC"),
                                "layer 'model.layers.0.self_attn.qkv_proj' (QKVParallelLinear) has type "
                                "'W4A8_DYNAMIC'"),
    "fused shards disagree": (_types(["model.layers.1.mlp.gate_proj"], "W8A16"),
                              "the shards of fused layer 'model.layers.1.mlp.gate_up_proj' have different types"),
    "C8 without its scales": (_set("kv_cache_type", "C8"),
                              "kv_cache_type 'C8' but quant_model_description.json names no "
                              "'model.layers.0.self_attn.k_proj.kv_cache_scale' for attention layer "
                              "'model.layers.0.self_attn.attn'"),
    "another KV cache type": (_set("kv_quant_type", "C4"), "kv_quant_type='C4' (a quantized KV cache) is not "
                                                           "supported"),
    "quantized attention": (_set("fa_quant_type", "FAQuant"), "fa_quant_type='FAQuant' (quantized attention) is not "
                                                              "supported"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_modelslim_checkpoint_is_refused_by_name(quant_hosts, quant_models, tmp_path, case):
    edit, message = CASES[case]
    assert message in _start_error(quant_hosts, _edited(tmp_path, quant_models["ms_dynamic"], edit))


C8_CONFLICTS = {
    "kv_cache_dtype": (dict(kv_cache_dtype="fp8"), "with kv_cache_dtype='fp8' (C8 makes the KV cache int8 itself"),
    "kv connector": (dict(kv_transfer_config={"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                                              "kv_connector_extra_config": {"shared_storage_path": "/nonexistent"}}),
                     "with a KV connector (transfers and offloads of int8 pages are not tested yet)"),
}


@pytest.mark.parametrize("case", list(C8_CONFLICTS))
def test_c8_with_what_its_int8_cache_cannot_serve_is_refused_by_name(quant_hosts, c8_model, case):
    """A C8 checkpoint is refused before any layer is built where its int8 KV cache cannot be served."""
    engine, message = C8_CONFLICTS[case]
    error = quant_hosts("v1").start_error(c8_model, **(quant_hosts.engine | engine))
    assert error is not None, f"C8 with {case} started"
    assert "kv_cache_type 'C8' (int8 KV cache) of" in error["message"] and message in error["message"], error
