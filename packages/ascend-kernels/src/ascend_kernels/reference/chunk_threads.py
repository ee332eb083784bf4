"""Share a reference kernel's independent chunks between the caller and helper threads, one intra-op thread each.

The block-matmul attention is a string of small memory-bound torch ops per chunk. Run on N OpenMP threads, every
op is a parallel region ending at a barrier, and on a loaded machine each barrier can wait a scheduler slice for a
descheduled thread (see `attention._one_intra_op_thread`); run on one thread, the op leaves the other cores idle.
Here the caller's N intra-op threads become N Python threads instead (torch releases the GIL inside every op), each
running whole chunks on one intra-op thread and claiming the next chunk when done: no barrier per op, and the
caller waits only for chunks a helper actually took (a helper still waiting for a CPU when the caller has run out
of chunks is not waited for; it finds nothing left and goes back to sleep without touching torch).

Helper threads inherit the affinity of the thread that first needs them (a bound worker's CPU set) and live for
the process; a forked child, which has none of them, makes its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")
R = TypeVar("R")

# A chunk is at most a few MiB of gathered K/V (milliseconds); a helper holding one for this long is stuck.
HELPER_TIMEOUT_S = 300.0

_POOLS: dict[int, tuple[ThreadPoolExecutor, int]] = {}
_POOLS_LOCK = threading.Lock()


def _helpers(count: int) -> ThreadPoolExecutor:
    """This process's pool of at least `count` helper threads."""
    pid = os.getpid()
    with _POOLS_LOCK:
        pool, size = _POOLS.get(pid, (None, 0))
        if pool is None or size < count:
            if pool is not None:
                pool.shutdown(wait=False)
            pool = ThreadPoolExecutor(count, "ascend-ref-chunks")
            _POOLS[pid] = (pool, count)
        return pool


class _Claims:
    """Which items are claimed and finished, their results and the first error, under one condition."""

    def __init__(self, count: int) -> None:
        self.cond = threading.Condition()
        self.count = count
        self.claimed = 0
        self.finished = 0
        self.results: list = [None] * count
        self.error: BaseException | None = None

    def claim(self) -> int | None:
        with self.cond:
            if self.error is not None or self.claimed == self.count:
                return None
            self.claimed += 1
            return self.claimed - 1

    def finish(self, i: int, result=None, error: BaseException | None = None) -> None:
        with self.cond:
            self.results[i] = result
            if error is not None and self.error is None:
                self.error = error
            self.finished += 1
            self.cond.notify_all()


def run_chunks(fn: Callable[[T], R], items: Sequence[T], threads: int) -> list[R]:
    """`[fn(item) for item in items]`, the items claimed in order by this thread and up to `threads - 1` helpers.

    Call it with this thread on one intra-op thread (inside `attention._one_intra_op_thread`): a helper sets its
    own count to one when it takes its first item, which is while this call waits, so inside that window (torch's
    setter also stores the process default, which the window restores). Helpers run in the caller's grad and
    inference mode. The first error any thread raises is raised here once every taken item has finished; no item
    starts after one failed.
    """
    helpers = min(threads, len(items)) - 1
    if helpers < 1:
        return [fn(item) for item in items]
    claims = _Claims(len(items))
    # Grad and inference mode are per thread: a helper runs its chunks in the caller's.
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def drain(helper: bool) -> None:
        first = True
        while (i := claims.claim()) is not None:
            if helper and first:
                # Only once an item is taken, i.e. while the caller waits inside its window (this setter also
                # stores torch's process default). On every call, not once per thread: MKL keeps its own
                # per-thread count beside OpenMP's. torch._C's setter: bound CPU workers make torch's a no-op.
                torch._C.set_num_threads(1)
                first = False
            try:
                result = fn(items[i])
            except BaseException as exc:  # noqa: BLE001  (handed to the caller by finish)
                claims.finish(i, error=exc)
                return
            claims.finish(i, result)

    def help_drain() -> None:
        with torch.inference_mode(inference), torch.set_grad_enabled(grad):
            drain(True)

    pool = _helpers(helpers)
    for _ in range(helpers):
        pool.submit(help_drain)
    drain(False)
    with claims.cond:
        # Everything is claimed (or an item failed): wait for the items helpers hold, not for idle helpers.
        if not claims.cond.wait_for(lambda: claims.finished == claims.claimed, timeout=HELPER_TIMEOUT_S):
            raise TimeoutError(
                f"a reference-kernel helper thread held a chunk for over {HELPER_TIMEOUT_S} s "
                f"({claims.finished} of {claims.claimed} taken chunks finished, {len(items)} in all)"
            )
        if claims.error is not None:
            raise claims.error
    return claims.results
