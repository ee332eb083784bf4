"""Worker half of the KV pool: zero-copy batched gets into, and puts from, the KV memory vLLM registered.

Loads run where the step starts them (small ones, so the request is runnable next step) or on a loader thread; a key
that fails to load (missing, evicted, lease expired, wrong size, store error) marks its blocks as load errors, so
vLLM recomputes them, and the request is always reported as finished receiving. Saves start after the step's
forward (`wait_for_save`) on a saver thread: keys already in the pool are skipped, the rest are put. Blocks a save
reads stay valid because a finished request is held until its saves are done and a preempted request's saves are
waited for before the step that may reuse its blocks; whatever a save does (fail, raise), the request is reported.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ascend_kv_transfer.kv_regions import connector_layers, describe_kv_caches
from ascend_kv_transfer.load_failures import LoadFailures
from ascend_kv_transfer.pool.block_layout import BlockLayout
from ascend_kv_transfer.pool.keys import PoolKeys
from ascend_kv_transfer.pool.scheduler_side import PoolStep, PoolTransfer
from ascend_kv_transfer.pool.store_client import OBJECT_ALREADY_EXISTS, StoreClient, code_name
from ascend_kv_transfer.ranks import RankCoords

logger = logging.getLogger(__name__)

# How long an idle step (nothing scheduled) waits for a load in flight before returning. vLLM's engine loop steps an
# idle engine without pause; on the core the worker is pinned to, that spinning would take the CPU the store's
# transfer threads need. A load that lands ends the wait at once.
IDLE_WAIT_S = 0.005


@dataclass
class PoolWorkerStats:
    loads: int = 0
    inline_loads: int = 0
    blocks_loaded: int = 0
    bytes_loaded: int = 0
    load_seconds: float = 0.0
    load_failed_blocks: int = 0
    saves: int = 0
    objects_stored: int = 0
    objects_skipped_present: int = 0
    bytes_stored: int = 0
    save_seconds: float = 0.0
    put_failed_objects: int = 0
    save_errors: int = 0
    saves_left_to_rank0: int = 0  # save jobs this TP rank skipped: TP rank 0 puts the same bytes
    # Objects a save published after vLLM was told its blocks were free (the save outlived wait_for_saves): removed
    # again, since the put may have read bytes of the blocks' next owner.
    abandoned_objects_removed: int = 0


@dataclass
class LoadResult:
    req_id: str
    failed_block_ids: list[list[int]]  # per group


class PoolWorker:
    def __init__(self, *, client: StoreClient, keys: PoolKeys, rank: RankCoords, layer_groups: dict[str, int],
                 layer_order: dict[int, list[str]], num_blocks: int, inline_load_max_bytes: int,
                 save_wait_timeout_s: float, saves: bool = True):
        self.client = client
        self.saves = saves
        self.keys = keys
        self.rank = rank
        self.layer_groups = layer_groups
        self.layer_order = layer_order
        self.num_blocks = num_blocks
        self.inline_load_max_bytes = inline_load_max_bytes
        self.save_wait_timeout_s = save_wait_timeout_s
        self.layout: BlockLayout | None = None
        self.stats = PoolWorkerStats()
        self.recent_loads: dict[str, dict[str, Any]] = {}
        self._device_type = "cpu"
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ascend-kv-pool-load")
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ascend-kv-pool-save")
        self._loaded: queue.Queue[LoadResult] = queue.Queue()
        self._lock = threading.Lock()
        self._saves_done = threading.Condition(self._lock)
        self._pending_saves: dict[str, int] = {}  # req -> save jobs not finished
        self._awaiting_report: set[str] = set()  # finished requests held until their saves are done
        # Requests whose saves wait_for_saves gave up on: their blocks went back to vLLM while a put still read them.
        self._abandoned: set[str] = set()
        self._finished_sending: set[str] = set()
        self._loads_in_flight = 0
        self._idle = False
        self.load_failures = LoadFailures(len(self.groups))

    @property
    def groups(self) -> list[int]:
        return sorted(self.layer_order)

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        ours = connector_layers(kv_caches, self.layer_groups)
        regions = describe_kv_caches(ours, self.num_blocks, self.layer_groups)
        self._kv_caches = ours  # the store holds raw addresses: keep the memory alive while it is registered
        self.layout = BlockLayout(regions.regions, self.layer_order)
        self._device_type = next(iter(ours.values())).device.type
        self.client.register(regions.storages)
        logger.info("KV pool: %d layers in %d storage(s) registered; %s B per block object, %s buffer(s) per key",
                    len(regions.regions), len(regions.storages),
                    [self.layout.object_bytes(g) for g in self.layout.groups],
                    [len(self.layout.segments[g]) for g in self.layout.groups])

    def _objects(self, job: PoolTransfer) -> tuple[list[str], list[list[int]], list[list[int]], list[tuple[int, int]]]:
        """Keys, buffers and (position in the job, group index) of a job's objects, block-major."""
        assert self.layout is not None
        keys, ptrs, sizes, where = [], [], [], []
        for i, block_hash in enumerate(job.hashes):
            for gi, group in enumerate(self.groups):
                block_id = job.block_ids[gi][i]
                addrs, lengths = self.layout.buffers(group, block_id)
                keys.append(self.keys.key(self.rank, group, block_hash))
                ptrs.append(addrs)
                sizes.append(lengths)
                where.append((i, gi))
        return keys, ptrs, sizes, where

    # ---- loads --------------------------------------------------------------------------------------------------
    def start_loads(self, jobs: list[PoolTransfer]) -> None:
        for job in jobs:
            nbytes = job.num_blocks * sum(self.layout.object_bytes(g) for g in self.groups) if self.layout else 0
            if nbytes <= self.inline_load_max_bytes:
                self.stats.inline_loads += 1
                self._load(job)
            else:
                with self._lock:
                    self._loads_in_flight += 1
                self._loader.submit(self._load, job, True)

    def _load(self, job: PoolTransfer, threaded: bool = False) -> None:
        t0 = time.perf_counter()
        failed_at: set[int] = set()  # positions in the job whose object failed in some group
        keys: list[str] = []
        sizes: list[list[int]] = []
        nbytes = 0
        try:
            assert self.layout is not None, "register_kv_caches() first"
            keys, ptrs, sizes, where = self._objects(job)
            codes = self.client.get(keys, ptrs, sizes)
            bad = []
            for key, code, lengths, (i, _gi) in zip(keys, codes, sizes, where, strict=True):
                if code != sum(lengths):
                    failed_at.add(i)
                    bad.append((key, code))
                else:
                    nbytes += code
            if bad:
                key, code = bad[0]
                logger.warning("KV pool: %d of %d objects of request %s failed to load (first %r: %s); vLLM "
                               "recomputes those blocks", len(bad), len(keys), job.req_id, key,
                               code_name(code) if code < 0 else f"{code} B instead of the object size")
        except Exception as e:  # any failure is a load error: vLLM recomputes, never decodes garbage
            failed_at = set(range(job.num_blocks))
            logger.warning("KV pool: loading %d blocks of request %s raised %s: %s; vLLM recomputes them",
                           job.num_blocks, job.req_id, type(e).__name__, e)
        dt = time.perf_counter() - t0
        failed = [[ids[i] for i in sorted(failed_at)] for ids in job.block_ids]
        with self._lock:
            self.stats.loads += 1
            self.stats.load_seconds += dt
            self.stats.bytes_loaded += nbytes
            self.stats.load_failed_blocks += len(failed_at)
            self.stats.blocks_loaded += job.num_blocks - len(failed_at)
            self.recent_loads[job.req_id] = {"keys": keys, "bytes": nbytes, "seconds": dt, "failed": len(failed_at),
                                             "buffer_sizes": sizes[0] if keys else []}
            while len(self.recent_loads) > 64:
                self.recent_loads.pop(next(iter(self.recent_loads)))
        self._loaded.put(LoadResult(job.req_id, failed))
        if threaded:
            with self._lock:
                self._loads_in_flight -= 1

    # ---- saves --------------------------------------------------------------------------------------------------
    def start_saves(self, jobs: list[PoolTransfer]) -> None:
        if not jobs:
            return
        if not self.saves:  # nothing pending: the requests are reported as soon as they finish
            with self._lock:
                self.stats.saves_left_to_rank0 += len(jobs)
            return
        if self._device_type != "cpu":
            import torch

            torch.accelerator.synchronize()  # the step's KV must be written before the store reads it
        with self._lock:
            for job in jobs:
                self._pending_saves[job.req_id] = self._pending_saves.get(job.req_id, 0) + 1
        for job in jobs:
            self._saver.submit(self._save, job)

    def _save(self, job: PoolTransfer) -> None:
        t0 = time.perf_counter()
        stored = skipped = failed = nbytes = 0
        published: list[str] = []  # keys this job created (not ones already present: those are others' objects)
        try:
            if self.client.available:
                keys, ptrs, sizes, _ = self._objects(job)
                present = self.client.exists(keys)
                todo = [i for i, code in enumerate(present) if code != 1]
                skipped = len(keys) - len(todo)
                codes = self.client.put([keys[i] for i in todo], [ptrs[i] for i in todo], [sizes[i] for i in todo])
                for i, code in zip(todo, codes, strict=True):
                    if code == 0 or code == OBJECT_ALREADY_EXISTS:
                        stored += 1
                        nbytes += sum(sizes[i])
                        if code == 0:
                            published.append(keys[i])
                    else:
                        failed += 1
                if failed:
                    first = next(c for c in codes if c not in (0, OBJECT_ALREADY_EXISTS))
                    logger.info("KV pool: %d of %d puts of request %s failed (%s); those blocks stay uncached",
                                failed, len(todo), job.req_id, code_name(first))
        except Exception as e:
            failed = job.num_blocks * len(self.groups) - stored - skipped
            with self._lock:
                self.stats.save_errors += 1
            logger.warning("KV pool: saving blocks of request %s raised %s: %s; they stay uncached", job.req_id,
                           type(e).__name__, e)
        finally:
            with self._lock:
                abandoned = job.req_id in self._abandoned
            if abandoned and published:
                self._unpublish(job.req_id, published)
            with self._lock:
                self.stats.saves += 1
                self.stats.save_seconds += time.perf_counter() - t0
                self.stats.objects_stored += stored
                self.stats.objects_skipped_present += skipped
                self.stats.bytes_stored += nbytes
                self.stats.put_failed_objects += failed
                left = self._pending_saves.get(job.req_id, 1) - 1
                if left > 0:
                    self._pending_saves[job.req_id] = left
                else:
                    self._pending_saves.pop(job.req_id, None)
                    self._abandoned.discard(job.req_id)
                    if job.req_id in self._awaiting_report:
                        self._awaiting_report.discard(job.req_id)
                        self._finished_sending.add(job.req_id)
                self._saves_done.notify_all()

    def _unpublish(self, req_id: str, keys: list[str]) -> None:
        """Remove what an abandoned save put: nobody may load bytes that could be another request's."""
        try:
            self.client.remove(keys)
        except Exception as e:  # the objects stay: say so loudly, they may hold another request's bytes
            logger.error("KV pool: removing %d objects of abandoned save of request %s raised %s: %s", len(keys),
                         req_id, type(e).__name__, e)
            return
        with self._lock:
            self.stats.abandoned_objects_removed += len(keys)
        logger.warning("KV pool: the save of request %s finished after its blocks were handed back; removed the %d "
                       "objects it published", req_id, len(keys))

    def finish_requests(self, req_ids: list[str]) -> None:
        """The scheduler holds these finished requests' blocks until we report their saves done."""
        with self._lock:
            for req_id in req_ids:
                if self._pending_saves.get(req_id):
                    self._awaiting_report.add(req_id)
                else:
                    self._finished_sending.add(req_id)

    def wait_for_saves(self, req_ids: list[str]) -> None:
        """Block (bounded) until the saves of `req_ids` are done: their blocks are about to be reused."""
        deadline = time.monotonic() + self.save_wait_timeout_s
        with self._lock:
            while any(self._pending_saves.get(r) for r in req_ids):
                left = deadline - time.monotonic()
                if left <= 0:
                    stuck = [r for r in req_ids if self._pending_saves.get(r)]
                    # Their blocks are reused from now on while the puts may still read them: what those puts
                    # publish is removed when they return (_unpublish).
                    self._abandoned.update(stuck)
                    self.client.disable(f"saves of preempted requests {stuck[:4]} still running after "
                                        f"{self.save_wait_timeout_s:g} s")
                    return
                self._saves_done.wait(timeout=left)

    # ---- step ---------------------------------------------------------------------------------------------------
    def start_step(self, step: PoolStep) -> None:
        self._idle = step.idle
        self.finish_requests(step.finished_saves)
        self.start_loads(step.loads)

    def get_finished(self) -> tuple[set[str], set[str]]:
        recving: set[str] = set()
        wait = IDLE_WAIT_S if self._idle and self._loads_in_flight else 0.0
        self._idle = False
        while True:
            try:
                result = self._loaded.get(timeout=wait) if wait else self._loaded.get_nowait()
            except queue.Empty:
                break
            wait = 0.0
            recving.add(result.req_id)
            self.load_failures.record(result.req_id, (b for ids in result.failed_block_ids for b in ids))
        with self._lock:
            sending, self._finished_sending = self._finished_sending, set()
        return sending, recving

    def stats_dict(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = dict(self.stats.__dict__)
            out["pending_saves"] = sum(self._pending_saves.values())
            out["held_requests"] = len(self._awaiting_report)
        out["pool_enabled"] = self.client.available
        out["namespace"], out["rank"] = self.keys.namespace, self.rank.tag
        return out

    def shutdown(self) -> None:
        self._loader.shutdown(wait=True, cancel_futures=False)
        self._saver.shutdown(wait=True, cancel_futures=False)
        self.client.close()
