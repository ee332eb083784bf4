"""Where the tiny checkpoints live and how each is built once: every builder in this package shares this cache.

A checkpoint is built into a private temporary folder and renamed into place, so a reader never sees a half-written
one and two processes building the same spec at once both end with a complete copy.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path


def default_cache_root() -> Path:
    """$ASCEND_VLLM_CACHE, or ~/.cache/ascend-vllm: models under models/, demo logs under logs/."""
    return Path(os.environ.get("ASCEND_VLLM_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "ascend-vllm"))


def default_cache_dir() -> Path:
    return default_cache_root() / "models"


def is_built(folder: Path) -> bool:
    return (folder / "config.json").exists() and any(folder.glob("*.safetensors"))


def built_once(folder: Path, build: Callable[[Path], object]) -> Path:
    """`folder`, calling `build(tmp)` to write it into a temporary sibling first when it is not there yet."""
    if is_built(folder):
        return folder
    tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    build(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # another process built the same folder first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
