"""Entry points: what vLLM's own plugin loader finds, and register() free of side effects without an NPU."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest


def test_our_entry_points_are_declared():
    platform = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.platform_plugins")}
    general = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert platform.get("ascend") == "ascend_platform.registration:register"
    assert general.get("ascend_kv_transfer") == "ascend_kv_transfer.registration:register"


def test_vllm_plugin_loader_sees_both(monkeypatch):
    from vllm.plugins import load_plugins_by_group

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert "ascend" in load_plugins_by_group("vllm.platform_plugins")
    assert "ascend_kv_transfer" in load_plugins_by_group("vllm.general_plugins")


def test_register_without_torch_npu_returns_none_and_imports_nothing_heavy():
    # A fresh interpreter, so nothing else has imported torch or torch_npu before us.
    code = (
        "import sys, os; os.environ.pop('ASCEND_VLLM_SIMULATE', None)\n"
        "from ascend_platform.registration import register\n"
        "before = set(sys.modules)\n"
        "r1, r2 = register(), register()\n"
        "assert r1 is None and r2 is None, (r1, r2)\n"
        "assert 'torch_npu' not in sys.modules\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_module_load_imports_neither_torch_nor_vllm():
    code = (
        "import sys\n"
        "import ascend_platform.registration, ascend_kv_transfer.registration\n"
        "heavy = {'torch', 'torch_npu', 'vllm'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize("value", ["1"])
def test_simulated_lane_is_an_explicit_switch(monkeypatch, value):
    from ascend_platform.registration import PLATFORM_CLASS, register

    monkeypatch.setenv("ASCEND_VLLM_SIMULATE", value)
    assert register() == PLATFORM_CLASS
    monkeypatch.setenv("ASCEND_VLLM_SIMULATE", "0")
    assert register() is None


def test_general_plugin_is_idempotent():
    # A fresh interpreter, as vLLM's plugin loader calls it once per process: the pytest process never imports
    # vLLM's engine modules (setuptools' distutils shim, which they pull in through torch's cpp_extension, once
    # resolved the standard library's distutils in this long-lived process and failed the import).
    code = (
        "from ascend_kv_transfer.registration import register\n"
        "first = register()\n"
        "assert isinstance(first, list) and first, first\n"
        "assert register() == [], 'a second call in the same process registered again'\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "ok", out.stdout + out.stderr


def test_torch_npu_status_says_why():
    from ascend_kernels.npu_probe import torch_npu_status

    status = torch_npu_status()
    assert not status.usable
    assert status.reason and ("torch_npu" in status.reason)
