"""The torch_npu wheel reader against the real torch_npu 2.13.0 wheel.

The wheel is fetched from PyPI (43 MB) into the wheel cache by the same code users run, once; nothing here is
skipped.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ascend_contracts import torch_npu_wheel as tnw
from ascend_contracts.torch_npu_wheel import TorchNpuWheelError, open_torch_npu_wheel
from ascend_contracts.wheels import cache_dir, fetch_wheel

VERSION = "2.13.0"


@pytest.fixture(scope="module")
def wheel_file() -> Path:
    return fetch_wheel(VERSION, cache_dir(), package="torch-npu")


@pytest.fixture(scope="module")
def wheel(wheel_file):
    return open_torch_npu_wheel(wheel_file)


def test_version_and_path(wheel, wheel_file):
    assert wheel.version == VERSION
    assert wheel.path == wheel_file.resolve()


def test_plain_string_schema_of_an_npu_op(wheel):
    assert wheel.schemas["npu_rms_norm"] == (
        "npu_rms_norm(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)")
    assert wheel.namespaces["npu_rms_norm"] == "npu"


def test_atb_schema_rebuilt_from_code(wheel):
    # These literals are not strings in libop_plugin_atb.so; they are assembled by the registration code.
    assert wheel.schemas["_npu_reshape_and_cache"] == (
        "_npu_reshape_and_cache(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_indices) -> ()")
    assert wheel.schemas["_npu_rotary_embedding"] == (
        "_npu_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, "
        "Tensor cos_sin_cache, bool is_neox_style) -> ()")
    assert wheel.namespaces["_npu_reshape_and_cache"] == "atb"
    assert wheel.schemas["npu_paged_cache_load"].startswith(
        "npu_paged_cache_load(Tensor key_cache, Tensor value_cache, Tensor block_table, Tensor context_lens, *, "
        "Tensor? seq_starts=None, bool cumsum=False) -> (Tensor, Tensor)")


def test_registered_form_wins_over_cpp_signature_text(wheel):
    schema = wheel.schemas["npu_fused_infer_attention_score"]
    assert "SymInt[]? actual_seq_lengths=None" in schema
    assert "SymIntArrayRef" not in schema and "int64_t" not in schema


def test_overloads_are_keyed_with_their_name(wheel):
    assert wheel.schemas["npu_paged_cache_load.out"].startswith("npu_paged_cache_load.out(")
    # `_npu_paged_attention_v2` exists only as an overload; torch_npu still exposes the packet.
    assert "_npu_paged_attention_v2" not in wheel.schemas
    assert wheel.schemas["_npu_paged_attention_v2.out"].startswith("_npu_paged_attention_v2.out(")


def test_every_schema_parses_and_is_keyed_by_its_own_name(wheel):
    assert len(wheel.schemas) > 300
    for key, text in wheel.schemas.items():
        parsed = torch._C.parse_schema(text)
        assert key == parsed.name + (f".{parsed.overload_name}" if parsed.overload_name else ""), text
        assert wheel.namespaces[key] in ("npu", "atb")


def test_atb_exposure_follows_atb_ops_lists(wheel):
    assert wheel.atb_exposure["_npu_reshape_and_cache"] == "torch_npu"
    assert wheel.atb_exposure["npu_paged_cache_load"] == "torch_npu.atb"


def test_text_reads_members_and_names_a_missing_one(wheel):
    assert 'Library("npu", "IMPL", "Meta")' in wheel.text(tnw.META_REGISTRATIONS)
    assert '@impl(m, "npu_fused_add_topk_div")' in wheel.text(tnw.ATB_META_REGISTRATIONS)
    with pytest.raises(TorchNpuWheelError, match="torch_npu/nope.py"):
        wheel.text("torch_npu/nope.py")


def test_version_string_goes_through_the_shared_cache(wheel, wheel_file, monkeypatch):
    monkeypatch.setenv("ASCEND_VLLM_WHEELS", str(wheel_file.parent))
    assert open_torch_npu_wheel(VERSION) is wheel


def test_sidecar_spares_the_scan_in_a_new_process(wheel, wheel_file, monkeypatch):
    monkeypatch.setattr(tnw, "_MEMO", {})

    def no_parse(path):
        raise AssertionError(f"re-parsed {path} although its sidecar is fresh")

    monkeypatch.setattr(tnw, "_parse", no_parse)
    again = open_torch_npu_wheel(wheel_file)
    assert again.schemas == wheel.schemas and again is not wheel


def test_rejects_what_is_neither_version_nor_path():
    with pytest.raises(TorchNpuWheelError, match="'no/such/wheel.whl'"):
        open_torch_npu_wheel("no/such/wheel.whl")
