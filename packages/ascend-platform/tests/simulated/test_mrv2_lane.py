"""How the simulated lane turns Triton's interpreter on (and only there), and the one error when MRV2 cannot run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ascend_platform.simulated import mrv2_lane

PROBE = textwrap.dedent("""
    import json, os, sys
    from vllm.platforms import current_platform
    from vllm.triton_utils import HAS_TRITON
    from triton import knobs
    from triton.backends import backends
    entry = backends.get("cpu")
    print(json.dumps({"platform": type(current_platform).__name__, "has_triton": bool(HAS_TRITON),
                      "interpret": bool(knobs.runtime.interpret), "env": os.environ.get("TRITON_INTERPRET"),
                      "cpu_driver": entry.driver.__name__ if entry else None,
                      "cpu_driver_active": bool(entry.driver.is_active()) if entry else None}))
""")


def _probe(simulate: bool, runner: str | None, tmp_path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("ASCEND_VLLM_SIMULATE", "VLLM_USE_V2_MODEL_RUNNER",
                                                           "TRITON_INTERPRET")}
    env["VLLM_CACHE_ROOT"] = str(tmp_path)
    if simulate:
        env["ASCEND_VLLM_SIMULATE"] = "1"
    if runner is not None:
        env["VLLM_USE_V2_MODEL_RUNNER"] = runner
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_simulated_lane_runs_triton_in_its_interpreter(tmp_path):
    got = _probe(True, None, tmp_path)
    assert got == {"platform": "SimulatedNPUPlatform", "has_triton": True, "interpret": True, "env": "1",
                   "cpu_driver": "InterpreterDriver", "cpu_driver_active": False}


@pytest.mark.parametrize(("simulate", "runner"), [(False, None), (False, "1"), (True, "0")])
def test_plain_vllm_and_the_v1_request_leave_triton_alone(simulate, runner, tmp_path):
    got = _probe(simulate, runner, tmp_path)
    assert got["has_triton"] is False and got["interpret"] is False and got["env"] is None
    assert got["cpu_driver"] is None


@pytest.mark.parametrize(("value", "expected"), [(None, "default"), ("0", "v1"), ("1", "v2")])
def test_requested_runner_reads_vllms_variable(monkeypatch, value, expected):
    if value is None:
        monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    else:
        monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", value)
    assert mrv2_lane.requested_runner() == expected


HIDE_TRITON = "import sys\nsys.modules['triton'] = None  # as if triton were not installed\n"
CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.engine.arg_utils import EngineArgs
    try:
        EngineArgs(model=sys.argv[1], dtype="float32", max_model_len=128, enforce_eager=True,
                   block_size=32).create_engine_config()
        print(json.dumps({"error": None}))
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
""")


def test_mrv2_requested_without_triton_fails_once_naming_what_is_missing(tmp_path):
    from ascend_testkit.models.tiny_llama import cached_tiny_llama

    model = cached_tiny_llama(cache_dir=tmp_path / "models")
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HIDE_TRITON)
    env = {**os.environ, "ASCEND_VLLM_SIMULATE": "1", "VLLM_USE_V2_MODEL_RUNNER": "1", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": f"{site}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "VLLM_CACHE_ROOT": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", CONFIG, str(model)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    error = json.loads(out.stdout.strip().splitlines()[-1])["error"]
    assert error is not None
    assert "Model Runner V2 was requested (VLLM_USE_V2_MODEL_RUNNER='1')" in error
    assert "the 'triton' package is not installed" in error
    assert error.count("Model Runner V2") == 1  # ours, not vLLM's "Model Runner V2 requires Triton." as well
