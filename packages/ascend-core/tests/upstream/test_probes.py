"""The probes against the installed vLLM, and the single error when a probe input is renamed or vLLM is missing."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

from ascend_core.upstream import Lane, UpstreamContractError, capabilities, default_loader, detect_capabilities
from ascend_core.upstream import lane as lane_mod

# What each CI lane's vLLM gives every probe (scripts/test-all runs this suite in both environments).
_LANES = {
    "0.32.0": dict(lane=Lane.CURRENT, kv_layer_field="layers", mla_ratio_field="tokens_per_state",
                   speculator_dp_arg="dp_sync_state", logits_skip_gather=True, kv_tensor_host_resident=True,
                   connector_unregister_kv_caches=False, strides={"offset", "layer_stride", "block_stride"}),
    "0.27.1": dict(lane=Lane.LEGACY, kv_layer_field="shared_by", mla_ratio_field="compress_ratio",
                   speculator_dp_arg="num_tokens_across_dp", logits_skip_gather=False, kv_tensor_host_resident=False,
                   connector_unregister_kv_caches=False, strides={"offset", "block_stride"}),
}


def test_installed_vllm_is_on_its_lane_with_every_probe_passing():
    caps = capabilities()
    assert caps.vllm_version in _LANES, f"CI runs 0.32.0 and 0.27.1, not {caps.vllm_version}"
    expected = _LANES[caps.vllm_version]
    assert caps.lane is expected["lane"]
    assert all(p.ok for p in caps.probes), [p for p in caps.probes if not p.ok]
    assert caps.kv_layer_field == expected["kv_layer_field"]
    assert caps.mla_ratio_field == expected["mla_ratio_field"]
    assert caps.speculator_dp_arg == expected["speculator_dp_arg"]
    assert caps.logits_skip_gather is expected["logits_skip_gather"]
    assert caps.kv_tensor_host_resident is expected["kv_tensor_host_resident"]
    assert caps.connector_unregister_kv_caches is expected["connector_unregister_kv_caches"]  # 0.33 adds it
    assert set(caps.kv_tensor_stride_fields) == expected["strides"]


def test_capabilities_are_computed_once():
    assert capabilities() is capabilities()


@dataclasses.dataclass
class RenamedKVCacheTensor:  # what a future vLLM renaming `layers` would look like
    size: int
    layer_names: list[str]


@dataclasses.dataclass
class RenamedMLASpec:
    block_size: int
    ratio: int


def _loader_with(overrides):
    def load(module, attr=None):
        return overrides.get((module, attr)) or default_loader(module, attr)

    return load


def test_renamed_field_gives_one_error_naming_the_probe():
    load = _loader_with({("vllm.v1.kv_cache_interface", "KVCacheTensor"): RenamedKVCacheTensor})
    with pytest.raises(UpstreamContractError) as info:
        detect_capabilities(load)
    msg = str(info.value)
    assert "kv_tensor_layer_field" in msg and "layer_names" in msg
    assert "supported: vLLM" in msg
    assert [p.name for p in info.value.failed] == ["kv_tensor_layer_field"]


def test_every_failed_probe_is_listed_at_once():
    load = _loader_with({
        ("vllm.v1.kv_cache_interface", "KVCacheTensor"): RenamedKVCacheTensor,
        ("vllm.v1.kv_cache_interface", "MLAAttentionSpec"): RenamedMLASpec,
    })
    with pytest.raises(UpstreamContractError) as info:
        detect_capabilities(load)
    assert {p.name for p in info.value.failed} == {"kv_tensor_layer_field", "mla_ratio_field"}
    assert "tokens_per_state" in str(info.value) and "compress_ratio" in str(info.value)


def test_a_probe_that_raises_is_reported_not_propagated():
    def load(module, attr=None):
        if attr == "LogitsProcessor":
            raise AttributeError("module has no attribute 'LogitsProcessor'")
        return default_loader(module, attr)

    caps = detect_capabilities(load)  # optional probe: no error, but reported
    probe = next(p for p in caps.probes if p.name == "logits_skip_gather")
    assert not probe.ok and "LogitsProcessor" in probe.detail


def test_uninstalled_vllm_is_one_clear_error(monkeypatch):
    real_find_spec = importlib.util.find_spec

    def no_vllm(name, *args, **kwargs):
        if name == "vllm" or name.startswith("vllm."):
            return None
        return real_find_spec(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", no_vllm)
    with pytest.raises(UpstreamContractError) as info:
        lane_mod.detect_capabilities()
    assert "not installed" in str(info.value)
    assert "vllm_importable" in str(info.value)
