"""`ascend-vllm doctor` run as a user would, readable and --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ascend_testkit.reach.collect import reach_env

CLI = shutil.which("ascend-vllm") or str(Path(sys.executable).with_name("ascend-vllm"))


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    full_env = {k: v for k, v in os.environ.items() if k != "ASCEND_VLLM_SIMULATE"}
    full_env.update(reach_env())  # the CLI's modules count as reached by this run (tests/reach)
    full_env.update(env)
    return subprocess.run([CLI, *args], capture_output=True, text=True, timeout=300, env=full_env)


def test_doctor_json_reports_the_lane_probes_and_entry_points():
    out = _run("doctor", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["vllm"]["version"] == "0.32.0"
    assert report["vllm"]["lane"] == "current"
    assert report["vllm"]["probes"] and all(p["ok"] for p in report["vllm"]["probes"])
    assert report["torch"]["version"].startswith("2.13.0")
    assert report["torch_npu"]["ok"] is False and "torch_npu" in report["torch_npu"]["detail"]
    assert report["mooncake"]["ok"] is True
    eps = report["entry_points"]["groups"]
    assert eps["vllm.platform_plugins"]["ascend"] == {"seen": True, "register_returns": None}
    assert eps["vllm.general_plugins"]["ascend_kv_transfer"]["seen"] is True
    assert report["simulated_npu"]["enabled"] is False


def test_doctor_readable_report_says_why_torch_npu_is_missing():
    out = _run("doctor")
    assert out.returncode == 0, out.stderr
    assert "vLLM        0.32.0  lane: current" in out.stdout
    assert "torch_npu is not installed" in out.stdout
    assert "vllm.platform_plugins: ascend -> register() returns None" in out.stdout


def test_cli_without_a_command_prints_help_and_fails():
    out = _run()
    assert out.returncode == 2
    assert "doctor" in out.stdout


def test_options_lists_every_additional_config_key_with_its_default_and_doc():
    from ascend_platform.plugin_config import AscendConfig

    out = _run("options", "--json")
    assert out.returncode == 0, out.stderr
    options = json.loads(out.stdout.strip().splitlines()[-1])
    assert list(options) == list(AscendConfig.model_fields), options.keys()
    assert all(o["doc"] for o in options.values()), options
    assert options["kernel_backend"]["default"] == repr(AscendConfig.model_fields["kernel_backend"].default)
    readable = _run("options")
    assert readable.returncode == 0, readable.stderr
    assert all(f"{key} (default {o['default']})" in readable.stdout for key, o in options.items()), readable.stdout
