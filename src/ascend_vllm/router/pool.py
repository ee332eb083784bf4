"""The upstream servers of one role (prefill or decode): health state, load, and the least-outstanding choice.

All state is touched from the router's single event loop, so no locks: a choice and its lease happen without an
`await` in between.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

logger = logging.getLogger(__name__)


@dataclass
class Upstream:
    url: str
    role: str
    # Unknown until the first health check answers; the router waits for that check before it serves.
    healthy: bool = False
    checked: bool = False
    last_error: str | None = "not checked yet"
    changed_at: float = field(default_factory=time.monotonic)
    outstanding: int = 0
    sent: int = 0
    ok: int = 0
    failed: int = 0

    def snapshot(self) -> dict:
        return {"url": self.url, "healthy": self.healthy, "last_error": self.last_error,
                "state_for_s": round(time.monotonic() - self.changed_at, 3), "outstanding": self.outstanding,
                "sent": self.sent, "ok": self.ok, "failed": self.failed}


class Lease:
    """One request's hold on an upstream: counted as outstanding until `release` (idempotent)."""

    def __init__(self, upstream: Upstream):
        self.upstream = upstream
        self.ok: bool | None = None  # the outcome, once released
        upstream.outstanding += 1
        upstream.sent += 1

    def release(self, ok: bool) -> None:
        if self.ok is not None:
            return
        self.ok = ok
        self.upstream.outstanding -= 1
        if ok:
            self.upstream.ok += 1
        else:
            self.upstream.failed += 1


class ServerPool:
    def __init__(self, role: str, urls: tuple[str, ...]):
        self.role = role
        self.upstreams = [Upstream(url, role) for url in urls]
        self._turn = 0  # rotates ties, so equally loaded servers share the work

    def healthy(self) -> list[Upstream]:
        return [u for u in self.upstreams if u.healthy]

    def pick(self, exclude: set[str] = frozenset()) -> Upstream | None:
        """The healthy server with the fewest outstanding requests (ties in turn), or None."""
        n = len(self.upstreams)
        candidates = [(u.outstanding, (i - self._turn) % n, u) for i, u in enumerate(self.upstreams)
                      if u.healthy and u.url not in exclude]
        if not candidates:
            return None
        self._turn = (self._turn + 1) % n
        return min(candidates, key=lambda c: (c[0], c[1]))[2]

    def lease(self, exclude: set[str] = frozenset()) -> Lease | None:
        upstream = self.pick(exclude)
        return Lease(upstream) if upstream is not None else None

    def set_health(self, upstream: Upstream, healthy: bool, reason: str | None) -> None:
        first = not upstream.checked
        if upstream.healthy != healthy or first:
            upstream.changed_at = time.monotonic()
            if healthy:
                logger.info("%s server %s is %s", self.role, upstream.url, "healthy" if first else "healthy again")
            else:
                logger.warning("%s server %s %s: %s", self.role, upstream.url,
                               "is not healthy" if first else "taken out", reason)
        upstream.checked = True
        upstream.healthy = healthy
        upstream.last_error = None if healthy else reason

    def unavailable_reason(self) -> str:
        """Why no server of this role can be used (for 503 answers)."""
        states = "; ".join(f"{u.url}: {u.last_error or 'busy'}" for u in self.upstreams)
        return f"no healthy {self.role} server ({states})"

    def snapshot(self) -> list[dict]:
        return [u.snapshot() for u in self.upstreams]
