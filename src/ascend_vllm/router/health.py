"""Health checks: every upstream's `GET /health` on a period, and at once for a server a request just saw fail.

A check that answers 200 puts a server (back) in its pool; anything else (refused, timeout, other status) takes it
out until a later check passes. vLLM answers `/health` with 200 while its engine is alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp

from ascend_vllm.router.pool import ServerPool, Upstream

logger = logging.getLogger(__name__)


def describe(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


class HealthChecker:
    def __init__(self, pools: list[ServerPool], session: aiohttp.ClientSession, *, interval_s: float,
                 timeout_s: float):
        self._pools = {u.url + "|" + p.role: (p, u) for p in pools for u in p.upstreams}
        self._session = session
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._pending: dict[str, asyncio.Task] = {}
        self._loop_task: asyncio.Task | None = None

    async def check(self, pool: ServerPool, upstream: Upstream) -> bool:
        try:
            async with self._session.get(upstream.url + "/health", timeout=self._timeout) as resp:
                await resp.read()
                healthy, reason = resp.status == 200, f"GET /health answered {resp.status}"
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            healthy, reason = False, f"GET /health failed ({describe(exc)})"
        pool.set_health(upstream, healthy, reason)
        return healthy

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(p, u) for p, u in self._pools.values()))

    def check_soon(self, pool: ServerPool, upstream: Upstream) -> None:
        """Check one server now, in the background (one pending check per server)."""
        key = upstream.url + "|" + pool.role
        if key in self._pending and not self._pending[key].done():
            return
        self._pending[key] = asyncio.get_running_loop().create_task(self.check(pool, upstream))

    def start(self) -> None:
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.check_all()
            except Exception:  # a bug here must not end health checking for good
                logger.exception("health check round failed")

    async def stop(self) -> None:
        tasks = [t for t in (self._loop_task, *self._pending.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
