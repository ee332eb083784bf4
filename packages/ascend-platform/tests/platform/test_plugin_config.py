"""The typed plugin configuration: defaults, nesting, and one-line errors naming the key and allowed values."""

from __future__ import annotations

import pytest

from ascend_platform.plugin_config import AscendConfig, AscendConfigError, describe_options, parse_ascend_config


def test_defaults_and_documented_options():
    cfg = parse_ascend_config(None)
    assert cfg == AscendConfig()
    assert (cfg.chip, cfg.graph_mode, cfg.kv_cache_mode, cfg.kernel_backend) == ("auto", "auto", "auto", "auto")
    assert all(doc for _, _, doc in describe_options())


def test_flat_and_nested_forms_agree():
    flat = parse_ascend_config({"graph_mode": "eager", "chip": "310P"})
    nested = parse_ascend_config({"ascend": {"graph_mode": "eager", "chip": "310P"}})
    assert flat == nested and flat.chip == "310P"


def test_unknown_key_names_it_and_the_known_keys():
    with pytest.raises(AscendConfigError) as err:
        parse_ascend_config({"grpah_mode": "eager"})
    msg = str(err.value)
    assert "\n" not in msg and "unknown key 'grpah_mode'" in msg and "graph_mode" in msg


@pytest.mark.parametrize(("key", "value", "allowed"), [
    ("graph_mode", "warp", "'piecewise'"),
    ("chip", "910X", "'310P'"),
    ("kv_cache_mode", 3, "'private'"),
    ("block_size", 20, "multiple of 16"),
    ("graph_capture_sizes", [8, 4], "ascending"),
])
def test_bad_value_names_key_value_and_allowed(key, value, allowed):
    with pytest.raises(AscendConfigError) as err:
        parse_ascend_config({key: value})
    msg = str(err.value)
    assert "\n" not in msg and f"key {key!r}" in msg and repr(value) in msg and allowed in msg


def test_config_is_frozen():
    cfg = parse_ascend_config({})
    with pytest.raises(Exception):  # noqa: B017 (pydantic's frozen-instance error type)
        cfg.chip = "A3"
