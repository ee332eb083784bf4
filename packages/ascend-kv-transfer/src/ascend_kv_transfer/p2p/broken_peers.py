"""Which Mooncake peers failed a transfer, and when each may be tried again.

A failed batch puts its peer in a cool-down: transfers to it fail fast (no blind retry into a peer Mooncake just
rejected, say after an over-full queue) until the cool-down ends. Then exactly one transfer goes through as the
probe, while the others still fail fast: if it succeeds the peer is healthy again, if it fails a new cool-down
starts. Without the cool-down a cut link that came back would leave the peer unusable until the engine restarts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable


class BrokenPeerError(RuntimeError):
    pass


@dataclasses.dataclass
class _Broken:
    reason: str
    retry_at: float  # on the monotonic clock
    probing: bool = False


class BrokenPeers:
    def __init__(self, retry_after_s: float, *, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time):
        if not retry_after_s > 0:
            raise ValueError(f"retry_after_s={retry_after_s!r}: must be > 0")
        self.retry_after_s = retry_after_s
        self._clock, self._wall = clock, wall
        self._peers: dict[str, _Broken] = {}
        self._lock = threading.Lock()

    def reason(self, peer: str) -> str | None:
        state = self._peers.get(peer)
        return None if state is None else state.reason

    def admit(self, peer: str) -> bool:
        """Before a transfer to `peer`: False if it is healthy, True if this transfer is the probe after its
        cool-down (report it with `succeeded` or `failed`); raises BrokenPeerError while it cools down or while
        another transfer probes it."""
        with self._lock:
            state = self._peers.get(peer)
            if state is None:
                return False
            now = self._clock()
            if state.probing:
                raise BrokenPeerError(f"Mooncake peer {peer} is broken ({state.reason}); not retrying until the "
                                      "probe transfer under way ends")
            if now < state.retry_at:
                left = state.retry_at - now
                at = time.strftime("%X", time.localtime(self._wall() + left))
                raise BrokenPeerError(f"Mooncake peer {peer} is broken ({state.reason}); not retrying until {at} "
                                      f"(in {left:.1f} s)")
            state.probing = True
            return True

    def failed(self, peer: str, why: str) -> float:
        """A transfer to `peer` failed: it cools down (again) from now. Returns the seconds until the next probe."""
        with self._lock:
            self._peers[peer] = _Broken(why, self._clock() + self.retry_after_s)
        return self.retry_after_s

    def succeeded(self, peer: str) -> bool:
        """A transfer to `peer` went through; True if that ended a broken spell (it was the probe)."""
        with self._lock:
            return self._peers.pop(peer, None) is not None
