"""One writer thread and FIFO queue per decode peer: the layerwise push's writes leave the forward pass.

`save_kv_layer` only enqueues; the peer's thread runs the write (Mooncake's batch calls release the GIL while the
bytes move). Writes to one peer keep their order (a request's bulk push after its layers, steps in stream order);
a slow or dead peer holds up only its own queue, never the forward pass or another peer's writes. A queue is
bounded (`MAX_QUEUED_PER_PEER` jobs): a peer that stopped taking writes fails the transfers queued past it, rather
than holding an unbounded backlog (and the KV blocks its jobs reference) until it returns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

Job = Callable[[], None]

# Jobs waiting per peer; a layer's write of one step is one job, so this is thousands of steps of a stalled peer.
MAX_QUEUED_PER_PEER = 4096


class _Writer:
    def __init__(self, peer: str):
        self.queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.waiting = 0  # jobs queued and not yet finished (under PeerWriters._lock)
        self.thread = threading.Thread(target=self._run, name=f"ascend-kv-push-{peer}", daemon=True)
        self.thread.start()

        self.done: Callable[[], None] = lambda: None

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a job records its own failure; this only keeps the thread alive for the next one
                logger.exception("layerwise push job failed")
            finally:
                self.done()


class PeerWriters:
    def __init__(self, max_queued_per_peer: int = MAX_QUEUED_PER_PEER) -> None:
        if max_queued_per_peer < 1:
            raise ValueError(f"max_queued_per_peer={max_queued_per_peer}: must be >= 1")
        self.max_queued_per_peer = max_queued_per_peer
        self._writers: dict[str, _Writer] = {}
        self._lock = threading.Lock()
        self.refused = 0

    def submit(self, peer: str, job: Job) -> bool:
        """Run `job` on `peer`'s thread after the jobs submitted before it for that peer. Never blocks: False (the
        job not queued) when the peer already has `max_queued_per_peer` jobs waiting."""
        with self._lock:
            writer = self._writers.get(peer)
            if writer is None:
                writer = self._writers[peer] = _Writer(peer)
                writer.done = lambda w=writer: self._finished(w)
            if writer.waiting >= self.max_queued_per_peer:
                self.refused += 1
                return False
            writer.waiting += 1
        writer.queue.put(job)
        return True

    def _finished(self, writer: _Writer) -> None:
        with self._lock:
            writer.waiting -= 1

    def waiting(self, peer: str) -> int:
        with self._lock:
            writer = self._writers.get(peer)
            return 0 if writer is None else writer.waiting

    def peers(self) -> int:
        with self._lock:
            return len(self._writers)

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop every thread after its queued jobs (each bounded by the transfer timeouts); wait up to `timeout_s`."""
        with self._lock:
            writers, self._writers = list(self._writers.values()), {}
        for writer in writers:
            writer.queue.put(None)
        for writer in writers:
            writer.thread.join(timeout=timeout_s)
