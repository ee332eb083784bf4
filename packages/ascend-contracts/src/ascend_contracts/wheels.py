"""Fetch published vLLM release wheels for static contract checks, into a cache that is reused.

`pip download --no-deps vllm==X` (about 0.3 GB each) into `$ASCEND_VLLM_WHEELS` (default
`~/.cache/ascend-vllm/wheels`). The wheel is never installed; the checker reads it as a zip.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE_ENV = "ASCEND_VLLM_WHEELS"
DEFAULT_CACHE = Path("~/.cache/ascend-vllm/wheels")
DOWNLOAD_TIMEOUT_S = 1800
_VERSION = re.compile(r"^\d+(\.\d+){1,3}([a-z]+\d+)?(\.post\d+)?(\.dev\d+)?$")


class WheelFetchError(RuntimeError):
    """A wheel could not be downloaded; the message carries pip's own output."""


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def _dist_name(package: str) -> str:
    # Wheel file names carry the normalised distribution name: `torch-npu` is published as `torch_npu-*.whl`.
    return re.sub(r"[-_.]+", "_", package).lower()


def cached_wheel(version: str, folder: Path | None = None, package: str = "vllm") -> Path | None:
    folder = folder or cache_dir()
    found = sorted(folder.glob(f"{_dist_name(package)}-{version}-*.whl")) if folder.is_dir() else []
    return found[0] if found else None


def _pip() -> list[str]:
    if importlib.util.find_spec("pip") is not None:
        return [sys.executable, "-m", "pip"]
    for name in ("pip3", "pip"):
        exe = shutil.which(name)
        if exe:
            return [exe]
    raise WheelFetchError("no pip found (neither this interpreter's pip module nor pip/pip3 on PATH)")


def fetch_wheel(version: str, folder: Path | None = None, timeout_s: float = DOWNLOAD_TIMEOUT_S,
                package: str = "vllm") -> Path:
    """The path of `<package>-<version>-*.whl` (vLLM unless told), downloading it with pip unless already cached."""
    if not _VERSION.match(version):
        raise ValueError(f"not a release version: {version!r} (e.g. '0.33.0')")
    folder = folder or cache_dir()
    hit = cached_wheel(version, folder, package)
    if hit is not None:
        return hit
    folder.mkdir(parents=True, exist_ok=True)
    # Download beside the cache and move the finished file in, so an interrupted download never looks cached.
    with tempfile.TemporaryDirectory(dir=folder, prefix=".download-") as tmp:
        cmd = [*_pip(), "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
               "-d", tmp, f"{package}=={version}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise WheelFetchError(f"pip download {package}=={version} took longer than {timeout_s:.0f} s") from exc
        wheels = sorted(Path(tmp).glob(f"{_dist_name(package)}-{version}-*.whl"))
        if done.returncode != 0 or not wheels:
            raise WheelFetchError(f"pip download {package}=={version} failed (exit {done.returncode}):\n"
                                  f"{done.stderr.strip() or done.stdout.strip()}")
        target = folder / wheels[0].name
        os.replace(wheels[0], target)
    return target
