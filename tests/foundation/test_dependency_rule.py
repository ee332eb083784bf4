"""The dependency rule of docs/ARCHITECTURE.md, checked with import-linter on our tree and on planted violations."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = shutil.which("lint-imports") or str(Path(sys.executable).with_name("lint-imports"))


def _lint(cwd: Path, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([LINT, "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_our_packages_keep_the_dependency_rule():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _plant_tree(tmp: Path, importer: str, imported: str) -> None:
    for name in ("ascend_testkit", "ascend_contracts", "ascend_vllm", "ascend_platform", "ascend_kv_transfer",
                 "ascend_specdecode", "ascend_core", "ascend_kernels"):
        (tmp / name).mkdir()
        (tmp / name / "__init__.py").write_text("")
    (tmp / importer / "bad.py").write_text(f"import {imported}\n")
    config = (ROOT / "pyproject.toml").read_text()
    section = config[config.index("[tool.importlinter]"):]
    (tmp / "pyproject.toml").write_text(textwrap.dedent(section))


def test_a_planted_violation_is_caught(tmp_path):
    # kv-transfer must work without specdecode (and the reverse): siblings are independent.
    _plant_tree(tmp_path, "ascend_kv_transfer", "ascend_specdecode")
    result = _lint(tmp_path, pythonpath=str(tmp_path))
    assert result.returncode != 0
    assert "ascend_kv_transfer.bad -> ascend_specdecode" in result.stdout


def test_an_upward_import_is_caught(tmp_path):
    _plant_tree(tmp_path, "ascend_core", "ascend_platform")
    result = _lint(tmp_path, pythonpath=str(tmp_path))
    assert result.returncode != 0
    assert "ascend_core.bad -> ascend_platform" in result.stdout


@pytest.mark.parametrize("dev_only", ["ascend_testkit", "ascend_contracts"])
def test_a_runtime_import_of_a_development_package_is_caught(tmp_path, dev_only):
    # The testkit and the contract checker are development-only: a runtime wheel that imported either would break
    # `pip install` users.
    _plant_tree(tmp_path, "ascend_kv_transfer", dev_only)
    result = _lint(tmp_path, pythonpath=str(tmp_path))
    assert result.returncode != 0
    assert f"ascend_kv_transfer.bad -> {dev_only}" in result.stdout
