"""`scripts/test-package NAME` runs a suite where only NAME and what it declares are installed: a planted test that
imports a sibling the package does not declare fails there, while the shared workspace .venv lets it pass.

The planted tests go into a copy of the workspace (its pyprojects, lock, sources and the script; not the real
suites), tested by the copy's own test-package in an environment folder of this test. The copy shares the
checkout's byte-compiled vLLM base (ASCEND_VLLM_BASE_ENV): same lock, same base, built once.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
if UV is None:  # a missing tool fails the run naming it, never a silent skip
    pytest.fail("uv is not on PATH: these tests build wheels and environments with it (pip install uv)", pytrace=False)

PLANTED = '''
def test_declared_sibling_imports():
    import ascend_core.upstream  # ascend-kv-transfer declares ascend-core

    assert ascend_core.upstream


def test_undeclared_sibling_imports():
    import ascend_specdecode  # ascend-kv-transfer does not declare ascend-specdecode

    assert ascend_specdecode
'''



def _copy_workspace(dest: Path) -> None:
    for name in ("pyproject.toml", "uv.lock", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    (dest / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts/test-package", dest / "scripts/test-package")
    shutil.copytree(ROOT / "src", dest / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in sorted((ROOT / "packages").iterdir()):
        if not (folder / "pyproject.toml").is_file():
            continue
        target = dest / "packages" / folder.name
        target.mkdir(parents=True)
        for name in ("pyproject.toml", "README.md"):
            shutil.copy2(folder / name, target / name)
        shutil.copytree(folder / "src", target / "src", ignore=shutil.ignore_patterns("__pycache__"))
        (target / "tests").mkdir()


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("workspace")
    _copy_workspace(copy)
    (copy / "packages/ascend-kv-transfer/tests/test_planted_import.py").write_text(PLANTED)
    return copy


def test_an_undeclared_sibling_import_fails_in_the_package_environment(planted, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}
    env |= {"ASCEND_PACKAGE_ENVS": str(tmp_path / "envs"),
            "ASCEND_VLLM_BASE_ENV": str(ROOT / ".venv-packages" / "_vllm")}
    out = subprocess.run(["bash", "scripts/test-package", "ascend-kv-transfer", "-p", "no:cacheprovider", "-rA"],
                         cwd=planted, env=env, capture_output=True, text=True, timeout=1200)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "PASSED packages/ascend-kv-transfer/tests/test_planted_import.py::test_declared_sibling_imports" in text
    assert "FAILED packages/ascend-kv-transfer/tests/test_planted_import.py::test_undeclared_sibling_imports" in text
    assert "No module named 'ascend_specdecode'" in text


def test_the_shared_workspace_environment_cannot_tell(planted):
    """The reason for test-package: in the workspace .venv (every member installed) the planted import passes."""
    out = subprocess.run(["uv", "run", "--no-sync", "pytest", "-q", "-p", "no:cacheprovider",
                          str(planted / "packages/ascend-kv-transfer/tests/test_planted_import.py")],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0 and "2 passed" in out.stdout, out.stdout + out.stderr
