"""OpenMP thread placement for the simulated lane's workers, as vLLM-CPU does it for its own.

vLLM binds CPU workers' OpenMP threads (`OMPProcessManager`) only when the platform *is* the CPU platform; ours is
out of tree, so without this the worker runs as many unbound threads as there are cores, fighting the engine core's
busy loop for them (small GEMMs then wait milliseconds at every barrier). Same policy: `VLLM_CPU_OMP_THREADS_BIND`
"nobind" leaves threads alone, an explicit "0-3|4-7" list gives rank i the i-th set, "auto" (default) reserves one
CPU per local rank for the other processes and splits the rest between the ranks.
"""

from __future__ import annotations

import os

import torch
from vllm.logger import init_logger

logger = init_logger(__name__)


def _parse(ids: str) -> list[int]:
    out: list[int] = []
    for part in ids.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def worker_cpus(local_rank: int, local_world_size: int, spec: str | None = None,
                allowed: list[int] | None = None) -> list[int] | None:
    """The CPUs local rank `local_rank` should run its OpenMP threads on, or None to leave them unbound."""
    spec = spec if spec is not None else os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
    if spec == "nobind":
        return None
    if spec != "auto":
        lists = spec.split("|")
        if len(lists) < local_world_size:
            raise ValueError(f"VLLM_CPU_OMP_THREADS_BIND={spec!r} names {len(lists)} CPU lists for "
                             f"{local_world_size} local ranks")
        return _parse(lists[local_rank])
    cpus = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    usable = cpus[: len(cpus) - local_world_size] if len(cpus) > local_world_size else cpus
    per_rank = max(1, len(usable) // local_world_size)
    chosen = usable[local_rank * per_rank:(local_rank + 1) * per_rank]
    return chosen or usable[-1:]


def ranks_on_this_node(parallel_config) -> int:
    """How many ranks this worker's node runs. vLLM's `local_world_size` splits the world evenly over `nnodes`, which
    only its mp multi-node launch sets; a Ray placement leaves `nnodes` at 1 however many hosts its bundles span, and
    Ray's executors record instead the devices this node's ranks hold (`assigned_physical_gpu_ids`, set per node)."""
    on_node = getattr(parallel_config, "assigned_physical_gpu_ids", None)
    if parallel_config.distributed_executor_backend == "ray" and on_node:
        return len(on_node)
    return parallel_config.local_world_size


def bind_worker_threads(local_rank: int, local_world_size: int) -> list[int] | None:
    """Pin this worker's threads to its CPUs and size torch's OpenMP pool to them (before the skip-patch
    `CPUWorker` puts on `torch.set_num_threads`)."""
    cpus = worker_cpus(local_rank, local_world_size)
    if cpus is None:
        return None
    os.sched_setaffinity(0, cpus)
    torch.set_num_threads(len(cpus))
    logger.info("Ascend simulated worker %d: OpenMP threads on CPUs %s", local_rank, cpus)
    return cpus
