"""The built wheels, installed into fresh virtual environments, give what `pip install` users get.

Builds every member with `uv build --all-packages --no-sources` (so no wheel leans on the workspace), then:
- no runtime wheel carries the development-only testkit or contract checker, and none (meta-package included)
  depends on either;
- each runtime wheel installs ALONE (with its declared dependencies only, beside the locked vLLM build users bring)
  into a fresh virtual environment, and every one of its modules imports there;
- the meta-package installs the whole set with both vLLM entry points and pulls no vLLM in by itself;
- ascend-kv-transfer alone has no platform or specdecode and still exposes its vLLM plugin.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv")
if UV is None:  # a missing tool fails the run naming it, never a silent skip
    pytest.fail("uv is not on PATH: these tests build wheels and environments with it (pip install uv)", pytrace=False)
TORCH_WHEELS = "/opt/wheels"  # the local CPU torch (see README); elsewhere PyTorch's CPU index
RUNTIME = {  # distribution -> import packages it must carry
    "ascend-kernels": ["ascend_kernels"],
    "ascend-core": ["ascend_core"],
    "ascend-kv-transfer": ["ascend_kv_transfer"],
    "ascend-specdecode": ["ascend_specdecode"],
    "ascend-platform": ["ascend_platform"],
    "ascend-vllm": ["ascend_vllm"],
}
DEV_ONLY = {"ascend-testkit", "ascend-contracts"}



def _workspace_versions() -> dict[str, str]:
    """Distribution -> version, from each member's pyproject (the root's is the meta-package's)."""
    import tomllib

    out = {}
    for path in [ROOT / "pyproject.toml", *sorted(ROOT.glob("packages/*/pyproject.toml"))]:
        project = tomllib.loads(path.read_text())["project"]
        if project["name"] not in DEV_ONLY:
            out[project["name"]] = project["version"]
    return out


def _run(args: list[str], **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(args, capture_output=True, text=True, timeout=900, **kw)
    assert out.returncode == 0, f"{' '.join(args)}\n{out.stdout}\n{out.stderr}"
    return out


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_"))}


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    _run([UV, "build", "--all-packages", "--no-sources", "--wheel", "-o", str(out)], cwd=ROOT)
    return out


@pytest.fixture(scope="module")
def locked_third_party(tmp_path_factory) -> Path:
    """The lock's third-party set (vLLM's CPU build and what it needs, minus the workspace's own packages)."""
    path = tmp_path_factory.mktemp("lock") / "requirements.txt"
    out = _run([UV, "export", "--frozen", "--no-emit-workspace", "--no-hashes", "--no-header"], cwd=ROOT)
    path.write_text(out.stdout)
    return path


def _wheel(wheelhouse: Path, dist: str) -> Path:
    found = sorted(wheelhouse.glob(f"{dist.replace('-', '_')}-*.whl"))
    assert len(found) == 1, f"{dist}: {found}"
    return found[0]


def _venv_with(tmp: Path, wheelhouse: Path, *requirements: str, base: Path | None = None) -> Path:
    """A fresh venv with `requirements` resolved from the wheelhouse; `base` (a requirements file) is installed
    first exactly as written (no resolution: the lock already excluded what does not load beside CPU torch)."""
    venv = tmp / "venv"
    python = venv / "bin" / "python"
    _run([UV, "venv", "-q", "--python", "3.11", str(venv)], env=_clean_env())
    constraints = tmp / "constraints.txt"
    constraints.write_text("torch==2.13.0+cpu\n")  # never a multi-GB CUDA torch
    # --no-config: a pip user's install, not this workspace's settings (its compile-bytecode would byte-compile each
    # fresh venv's whole vLLM and torch, minutes of CI for nothing these checks read)
    links = ["--no-config", "--find-links", str(wheelhouse), "--find-links", TORCH_WHEELS]
    if base is not None:
        _run([UV, "pip", "install", "-q", "--python", str(python), *links, "--no-deps", "-r", str(base)],
             env=_clean_env())
    _run([UV, "pip", "install", "-q", "--python", str(python), *links, "--constraint", str(constraints),
          *requirements], env=_clean_env())
    return python


def _check(python: Path, code: str) -> str:
    return _run([str(python), "-c", code], cwd="/", env=_clean_env()).stdout


def test_every_member_builds_a_wheel(wheelhouse):
    names = sorted(p.name.split("-")[0] for p in wheelhouse.glob("*.whl"))
    assert names == ["ascend_contracts", "ascend_core", "ascend_kernels", "ascend_kv_transfer", "ascend_platform",
                     "ascend_specdecode", "ascend_testkit", "ascend_vllm"]


@pytest.mark.parametrize("dist", sorted(RUNTIME))
def test_runtime_wheels_carry_no_development_package(wheelhouse, dist):
    with zipfile.ZipFile(_wheel(wheelhouse, dist)) as whl:
        names = whl.namelist()
        metadata = whl.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == set(RUNTIME[dist]), f"{dist} carries {sorted(tops)}"
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert not [r for r in requires if "testkit" in r or "ascend-contracts" in r], requires


@pytest.mark.parametrize("dist", sorted(d for d in RUNTIME if d != "ascend-vllm"))
def test_each_runtime_wheel_alone_imports_every_module(wheelhouse, locked_third_party, tmp_path, dist):
    """Beside the locked vLLM build, the wheel and its declared dependencies are all a user needs."""
    python = _venv_with(tmp_path, wheelhouse, str(_wheel(wheelhouse, dist)), base=locked_third_party)
    out = _check(python, (
        "import importlib, importlib.util, pkgutil, sys\n"
        f"roots = {RUNTIME[dist]!r}\n"
        "ours = ['ascend_kernels','ascend_core','ascend_kv_transfer','ascend_specdecode','ascend_platform',"
        "'ascend_vllm','ascend_testkit','ascend_contracts']\n"
        "print('present', sorted(n for n in ours if importlib.util.find_spec(n)))\n"
        "failed = []\n"
        "for root in roots:\n"
        "    pkg = importlib.import_module(root)\n"
        "    for info in pkgutil.walk_packages(pkg.__path__, root + '.'):\n"
        "        try:\n"
        "            importlib.import_module(info.name)\n"
        "        except Exception as exc:\n"
        "            failed.append(f'{info.name}: {type(exc).__name__}: {exc}')\n"
        "print('failed', failed)\n"
    ))
    present = eval(out.split("present ", 1)[1].splitlines()[0])  # noqa: S307 - our own printed list
    assert "ascend_testkit" not in present and "ascend_contracts" not in present
    assert set(RUNTIME[dist]) <= set(present)
    assert "failed []" in out, out


def test_meta_package_installs_a_consistent_importable_set(wheelhouse, tmp_path):
    python = _venv_with(tmp_path, wheelhouse, "ascend-vllm")
    out = _check(python, (
        "import importlib.metadata as m, importlib, importlib.util\n"
        "for mod in ['ascend_kernels','ascend_core','ascend_kv_transfer','ascend_specdecode','ascend_platform',"
        "'ascend_vllm']: importlib.import_module(mod)\n"
        "eps = {ep.name for g in ('vllm.platform_plugins','vllm.general_plugins') for ep in m.entry_points(group=g)}\n"
        "assert {'ascend', 'ascend_kv_transfer'} <= eps, eps\n"
        "vs = {d: m.version(d) for d in ['ascend-vllm','ascend-kernels','ascend-core','ascend-kv-transfer',"
        "'ascend-specdecode','ascend-platform']}\n"
        "print('versions', sorted(vs.items()))\n"
        "print('vllm' if importlib.util.find_spec('vllm') else 'no-vllm')\n"
        "print('testkit' if importlib.util.find_spec('ascend_testkit') else 'no-testkit')\n"
    ))
    assert f"versions {sorted(_workspace_versions().items())}" in out  # each member at its own pyproject's version
    assert "no-vllm" in out  # no member pulls vllm in: users bring the build for their device
    assert "no-testkit" in out
    assert (python.parent / "ascend-vllm").exists()
    # The development commands are absent from a user's install, and typing one says where it comes from.
    typed = subprocess.run([str(python.parent / "ascend-vllm"), "contracts", "check"], capture_output=True,
                           text=True, timeout=120, cwd="/", env=_clean_env())
    assert typed.returncode == 2, typed.stdout + typed.stderr
    assert "'contracts' comes with the development-only ascend-contracts package" in typed.stderr


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
