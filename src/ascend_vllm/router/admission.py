"""Bounded admission: at most `max_inflight` requests are proxied at once and at most `max_queued` wait for a slot
(each for at most `timeout_s`); beyond that the router answers 503 at once instead of queueing without bound."""

from __future__ import annotations

import asyncio

from ascend_vllm.router.errors import RouterError


class Admission:
    def __init__(self, max_inflight: int, max_queued: int, timeout_s: float):
        self.max_inflight = max_inflight
        self.max_queued = max_queued
        self._timeout_s = timeout_s
        self._slots = asyncio.Semaphore(max_inflight)
        self.inflight = 0
        self.queued = 0

    async def acquire(self) -> None:
        if self._slots.locked():
            if self.queued >= self.max_queued:
                raise RouterError(503, f"router overloaded: {self.inflight} requests in flight and {self.queued} "
                                       f"queued (--max-inflight {self.max_inflight}, --max-queued {self.max_queued})")
            self.queued += 1
            try:
                await asyncio.wait_for(self._slots.acquire(), self._timeout_s)
            except asyncio.TimeoutError:
                raise RouterError(503, f"router overloaded: no slot freed within {self._timeout_s} s "
                                       f"({self.inflight} requests in flight)") from None
            finally:
                self.queued -= 1
        else:
            await self._slots.acquire()
        self.inflight += 1

    def release(self) -> None:
        self.inflight -= 1
        self._slots.release()
