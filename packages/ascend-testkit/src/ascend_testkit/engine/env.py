"""The environment of an engine host process: offline, small KV space, its own caches, pinned cores, its lane."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from ascend_testkit.models.checkpoint_cache import default_cache_root
from ascend_testkit.reach.collect import with_reach

LANES = ("simulated", "cpu")
# Set by vLLM or by us for every engine host; a caller's `extra` wins.
_BASE = {
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The engine core runs inside the host so tests can read the scheduler and the connectors.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # collective_rpc ships the testkit's probe functions to multi-rank workers by pickling them.
    "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
}


RUNNERS = {"v1": "0", "v2": "1"}
DEFAULT_CPUS_ENV = "ASCEND_TESTKIT_CPUS"  # the cores of engines that ask for none (a test shard's own core)


def default_runner(lane: str) -> str:
    """The runner a lane serves with when the user picks none: V1 on vLLM's CPU platform; in the simulated lane MRV2,
    unless the installed vLLM lacks what Ascend's MRV2 needs (`ascend_core.upstream.mrv2_unavailable_reason`, e.g.
    the legacy lane), where the lane serves with V1."""
    if lane not in LANES:
        raise ValueError(f"unknown engine lane {lane!r} (known: {', '.join(LANES)})")
    if lane == "cpu":
        return "v1"
    from ascend_core.upstream import mrv2_unavailable_reason

    return "v1" if mrv2_unavailable_reason() else "v2"


def vllm_cache_root(path: str | os.PathLike) -> Path:
    """A private VLLM_CACHE_ROOT at `path` whose `modelinfos/` is shared by every engine of this environment.

    vLLM learns a model class's capabilities in a subprocess that imports vLLM and the model again (10-30 s here)
    unless `modelinfos/` already holds them, keyed by the hash of the model's source file. Every other cache stays
    private to the engine. One shared folder per Python environment: two vLLM releases would otherwise overwrite
    each other's entry for the same class on every start.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    env_key = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    shared = default_cache_root() / "vllm-modelinfos" / env_key
    shared.mkdir(parents=True, exist_ok=True)
    link = root / "modelinfos"
    if not link.is_symlink() and not link.exists():
        link.symlink_to(shared, target_is_directory=True)
    return root


def engine_env(lane: str, cache_root: str | os.PathLike, *, cpus: str | int | None = None, runner: str | None = None,
               extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a host of `lane` ("simulated" or "cpu") with its own vLLM cache under `cache_root`.

    `cpus` pins the engine's OpenMP threads (`VLLM_CPU_OMP_THREADS_BIND`: "0", "1", "0|1" for two ranks); when None,
    `ASCEND_TESTKIT_CPUS` (if set) does: scripts/test-all runs two test shards side by side, each on its own core,
    and two unpinned engines would spread their OpenMP threads over both cores and spin against each other.
    `runner` ("v1", "v2"; None: vLLM's default) is the process's model runner, as a user's VLLM_USE_V2_MODEL_RUNNER
    is: the simulated lane prepares Triton for MRV2 (or not, for V1) once, when the process resolves its platform.
    """
    if lane not in LANES:
        raise ValueError(f"unknown engine lane {lane!r} (known: {', '.join(LANES)})")
    env = dict(os.environ if base is None else base)
    env.update(_BASE)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env["VLLM_CACHE_ROOT"] = str(cache_root)
    env.pop("ASCEND_VLLM_SIMULATE", None)
    if lane == "simulated":
        env["ASCEND_VLLM_SIMULATE"] = "1"
    env.pop("VLLM_USE_V2_MODEL_RUNNER", None)
    if runner is not None:
        if runner not in RUNNERS:
            raise ValueError(f"unknown model runner {runner!r} (known: v1, v2)")
        env["VLLM_USE_V2_MODEL_RUNNER"] = RUNNERS[runner]
    if cpus is None:
        cpus = env.get(DEFAULT_CPUS_ENV) or None
    if cpus is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = str(cpus)
    return with_reach(env, extra)
