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


def test_quantized_moe_experts_are_refused_naming_the_layer(quant_hosts, cache_root, tmp_path):
    """A ModelSlim description marking a Qwen3-MoE's experts W8A8_DYNAMIC: refused when the platform's routed experts
    are built (quantized experts are not served yet), before any weight loads. First in this module: a refused
    start leaves the host's parallel groups as that engine made them, and only a MoE engine creates the EP group."""
    from safetensors import safe_open

    from ascend_testkit.models.moe import TinyMoeSpec, cached_tiny_qwen3_moe

    source = cached_tiny_qwen3_moe(TinyMoeSpec(route_skew=2.0), cache_root / "models")
    folder = tmp_path / "moe"
    shutil.copytree(source, folder)
    names = set()
    for file in folder.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            names.update(f.keys())
    description = {"model_quant_type": "W8A8_DYNAMIC", "version": "1.0.0"}
    description.update({n: "W8A8_DYNAMIC" if ".experts." in n else "FLOAT" for n in names})
    (folder / DESCRIPTION).write_text(json.dumps(description))
    message = _start_error(quant_hosts, str(folder))
    assert message == ("model.layers.0.mlp.experts: the Ascend routed experts run unquantized experts only, not "
                       "'ascend'"), message


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
    "C8 KV cache": (_set("kv_cache_type", "C8"), "kv_cache_type='C8' (a quantized KV cache / attention) is not "
                                                 "supported"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_modelslim_checkpoint_is_refused_by_name(quant_hosts, quant_models, tmp_path, case):
    edit, message = CASES[case]
    assert message in _start_error(quant_hosts, _edited(tmp_path, quant_models["ms_dynamic"], edit))
