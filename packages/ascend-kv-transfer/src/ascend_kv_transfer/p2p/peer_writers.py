"""One writer thread and FIFO queue per decode peer: the layerwise push's writes leave the forward pass.

`save_kv_layer` only enqueues; the peer's thread runs the write (Mooncake's batch calls release the GIL while the
bytes move). Writes to one peer keep their order (a request's bulk push after its layers, steps in stream order);
a slow or dead peer holds up only its own queue, never the forward pass or another peer's writes.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

logger = logging.getLogger(__name__)

Job = Callable[[], None]


class _Writer:
    def __init__(self, peer: str):
        self.queue: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name=f"ascend-kv-push-{peer}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while True:
            job = self.queue.get()
            if job is None:
                return
            try:
                job()
            except Exception:  # a job records its own failure; this only keeps the thread alive for the next one
                logger.exception("layerwise push job failed")


class PeerWriters:
    def __init__(self) -> None:
        self._writers: dict[str, _Writer] = {}
        self._lock = threading.Lock()

    def submit(self, peer: str, job: Job) -> None:
        """Run `job` on `peer`'s thread after the jobs submitted before it for that peer. Never blocks."""
        with self._lock:
            writer = self._writers.get(peer)
            if writer is None:
                writer = self._writers[peer] = _Writer(peer)
        writer.queue.put(job)

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
