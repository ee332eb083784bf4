"""The testkit's vLLM general plugin: the schema-faithful torch_npu in an engine process only when asked, never after
a process has already cached "no torch_npu"."""

from __future__ import annotations

import sys

import pytest

from ascend_kernels.npu_probe import torch_npu_status
from ascend_testkit import torch_npu as fake
from ascend_testkit.torch_npu_plugin import FAKE_ENV, install_if_requested, requested

ENTRY_POINT = "ascend_testkit.torch_npu_plugin:install_if_requested"


@pytest.fixture
def clean_process(monkeypatch):
    """No torch_npu and no probe answer before and after (the fake and the probe cache are process-wide)."""
    monkeypatch.delenv(FAKE_ENV, raising=False)
    fake.uninstall()
    torch_npu_status.cache_clear()
    yield monkeypatch
    fake.uninstall()
    torch_npu_status.cache_clear()


def test_vllms_loader_finds_the_plugin():
    from importlib.metadata import entry_points

    values = [ep.value for ep in entry_points(group="vllm.general_plugins")]
    assert ENTRY_POINT in values, f"not installed (run `uv sync` after editing the testkit's entry points): {values}"


def test_nothing_happens_unless_asked(clean_process):
    install_if_requested()
    assert "torch_npu" not in sys.modules and not torch_npu_status().usable


def test_installed_when_asked_and_twice_is_harmless(clean_process):
    clean_process.setenv(FAKE_ENV, "1")
    install_if_requested()
    install_if_requested()
    status = torch_npu_status()
    assert status.usable and status.device_count == 1, status


def test_a_cached_no_stops_the_install(clean_process):
    assert not torch_npu_status().usable  # something probed before the plugin ran
    clean_process.setenv(FAKE_ENV, "1")
    with pytest.raises(RuntimeError, match="asked for torch_npu before vLLM loaded the testkit's plugin"):
        install_if_requested()
    assert "torch_npu" not in sys.modules


def test_a_bad_value_names_the_variable(clean_process):
    clean_process.setenv(FAKE_ENV, "yes")
    with pytest.raises(ValueError, match=f"{FAKE_ENV}='yes'"):
        requested()
