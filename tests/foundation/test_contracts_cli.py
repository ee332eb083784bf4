"""`ascend-vllm contracts` as CI runs it on the installed vLLM: no uncovered P0/P1 drift, every used symbol pinned."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ascend_testkit.reach.collect import reach_env

ROOT = Path(__file__).resolve().parents[2]
CLI = shutil.which("ascend-vllm") or str(Path(sys.executable).with_name("ascend-vllm"))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ASCEND_VLLM_SIMULATE"} | reach_env()
    return subprocess.run([CLI, "contracts", *args], capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)


def _json(stdout: str) -> dict:
    """The command's JSON document (vLLM may log to stdout before it)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("{"))
    return json.loads("\n".join(lines[start:]))


def test_installed_vllm_has_no_uncovered_p0_p1_drift():
    out = _run("check", "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = _json(out.stdout)
    blocking = [f for f in report["findings"] if f["severity"] in ("P0", "P1") and not f.get("covered_by")]
    assert not blocking and report["blocking"] == 0, blocking


def test_every_vllm_symbol_our_sources_use_is_pinned():
    out = _run("scan", "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = _json(out.stdout)
    assert set(result["usages"]) >= {"ascend_core", "ascend_platform", "ascend_vllm"}  # every package was read
    assert not any(result["unpinned"].values()), result["unpinned"]
