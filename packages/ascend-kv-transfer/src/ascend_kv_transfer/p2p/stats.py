"""The P2P agent's counters: what its consumer side pulled and what its producer side freed, and why.

One record shared by both sides of an agent (a `kv_both` worker is both), exported through the connector's stats.
The producer's hold table (`p2p.holds`) counts under its own lock; pulls are recorded here under this one.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from ascend_kv_transfer.p2p.handoff import PullResult

logger = logging.getLogger(__name__)

# Pull errors kept for the stats (the newest).
_ERRORS_KEPT = 20


@dataclass
class AgentStats:
    pulls_ok: int = 0
    pulls_failed: int = 0
    blocks_pulled: int = 0
    bytes_pulled: int = 0
    transfer_entries: int = 0
    transfer_calls: int = 0
    held: int = 0
    released_done: int = 0
    # Freed on an "unread" notice: no decode rank reads this rank's copy of a replicated (MLA) transfer.
    released_unread: int = 0
    released_expired: int = 0
    # Freed on a ReleaseRequest (the router gave an unclaimed transfer up).
    released_by_request: int = 0
    errors: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def record(self, result: PullResult) -> None:
        """How one hand-off of the consumer side ended (from the step driver or a worker that refused it)."""
        with self._lock:
            if result.ok:
                self.pulls_ok += 1
                self.blocks_pulled += result.blocks
                self.bytes_pulled += result.nbytes
                self.transfer_entries += result.entries
                self.transfer_calls += result.calls
            else:
                self.pulls_failed += 1
                self.errors.append(f"{result.transfer_id}: {result.error}")
                del self.errors[:-_ERRORS_KEPT]
                logger.error("KV pull of transfer %s failed: %s", result.transfer_id, result.error)

    def as_dict(self) -> dict:
        out = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return dict(out, errors=list(self.errors[-_ERRORS_KEPT:]))
