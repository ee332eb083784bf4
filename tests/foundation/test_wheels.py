"""The built wheels, installed into fresh virtual environments, give what `pip install` users get.

Builds every member with `uv build --all-packages --no-sources` (so no wheel leans on the workspace), then:
the meta-package installs the whole set with importable packages and both entry points; ascend-kv-transfer
installs alone, without the platform or specdecode, and still exposes its vLLM plugin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
TORCH_WHEELS = "/opt/wheels"  # the local CPU torch (see README); elsewhere PyTorch's CPU index

pytestmark = pytest.mark.skipif(UV is None, reason="uv is required to build the wheels")


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, **kw)
    assert out.returncode == 0, f"{' '.join(args)}\n{out.stdout}\n{out.stderr}"
    return out


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    _run([UV, "build", "--all-packages", "--no-sources", "--wheel", "-o", str(out)], cwd=ROOT)
    return out


def _venv_with(tmp: Path, wheelhouse: Path, *requirements: str) -> Path:
    venv = tmp / "venv"
    _run([UV, "venv", "-q", "--python", "3.11", str(venv)])
    constraints = tmp / "constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n")  # never a multi-GB CUDA torch
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIRTUAL_ENV")}
    _run([UV, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--find-links", str(wheelhouse),
          "--find-links", TORCH_WHEELS, "--constraint", str(constraints), *requirements], env=env)
    return venv / "bin" / "python"


def _check(python: Path, code: str) -> str:
    return _run([str(python), "-c", code], cwd="/").stdout


def test_every_member_builds_a_wheel(wheelhouse):
    names = sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl"))
    assert names == ["ascend_core", "ascend_kernels", "ascend_kv_transfer", "ascend_platform", "ascend_specdecode",
                     "ascend_vllm"]


def test_meta_package_installs_a_consistent_importable_set(wheelhouse, tmp_path):
    python = _venv_with(tmp_path, wheelhouse, "ascend-vllm")
    out = _check(python, (
        "import importlib.metadata as m, importlib\n"
        "for mod in ['ascend_kernels','ascend_core','ascend_kv_transfer','ascend_specdecode','ascend_platform',"
        "'ascend_vllm']: importlib.import_module(mod)\n"
        "eps = {ep.name for g in ('vllm.platform_plugins','vllm.general_plugins') for ep in m.entry_points(group=g)}\n"
        "assert {'ascend', 'ascend_kv_transfer'} <= eps, eps\n"
        "vs = {d: m.version(d) for d in ['ascend-vllm','ascend-kernels','ascend-core','ascend-kv-transfer',"
        "'ascend-specdecode','ascend-platform']}\n"
        "print(sorted(set(vs.values())))\n"
        "import importlib.util; print('vllm' if importlib.util.find_spec('vllm') else 'no-vllm')\n"
    ))
    assert "['0.1.0']" in out
    assert "no-vllm" in out  # no member pulls vllm in: users bring the build for their device
    assert (python.parent / "ascend-vllm").exists()


def test_kv_transfer_installs_alone(wheelhouse, tmp_path):
    python = _venv_with(tmp_path, wheelhouse, "ascend-kv-transfer")
    out = _check(python, (
        "import importlib.util, importlib.metadata as m\n"
        "import ascend_kv_transfer, ascend_kv_transfer.registration\n"
        "print(sorted(n for n in ['ascend_platform','ascend_specdecode'] if importlib.util.find_spec(n)))\n"
        "print([ep.value for ep in m.entry_points(group='vllm.general_plugins')])\n"
    ))
    assert "[]" in out.splitlines()[0]
    assert "ascend_kv_transfer.registration:register" in out
