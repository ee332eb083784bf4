"""The router's ASGI application (Starlette, served by uvicorn: the stack under vLLM's own server).

Routes: `POST /v1/completions` and `POST /v1/chat/completions` (disaggregated, streamed or not), `GET /v1/models`
(from a healthy decode server), `GET /health` (200 while every role has a healthy server, else 503 saying which
lacks one) and `GET /status` (every server's health, last error, outstanding and finished requests).
Responses carry `x-request-id`, `x-router-prefill` and `x-router-decode` (the servers used).
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ascend_vllm.router.admission import Admission
from ascend_vllm.router.config import RouterConfig
from ascend_vllm.router.errors import PassThrough, RouterError, error_body
from ascend_vllm.router.health import HealthChecker, describe
from ascend_vllm.router.pool import ServerPool
from ascend_vllm.router.proxy import DisaggregatedProxy, decode_payload

logger = logging.getLogger(__name__)

_FORWARDED_HEADERS = ("authorization",)


@dataclass
class Counters:
    received: int = 0
    completed: int = 0
    failed: int = 0
    rejected: int = 0


@dataclass
class RouterState:
    config: RouterConfig
    prefill: ServerPool
    decode: ServerPool
    admission: Admission
    counters: Counters = field(default_factory=Counters)
    session: aiohttp.ClientSession | None = None
    health: HealthChecker | None = None
    proxy: DisaggregatedProxy | None = None


class _RelayResponse(StreamingResponse):
    """A stream whose clean-up (upstream connection, lease, admission slot) runs however the response ends, even
    when the client leaves before the body iterator ever starts."""

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], Awaitable[None]], **kwargs):
        super().__init__(content, **kwargs)
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._on_close()


def _error(exc: RouterError, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


def _state(request: Request) -> RouterState:
    return request.app.state.router


async def _disaggregated(request: Request, path: str) -> Response:
    st = _state(request)
    st.counters.received += 1
    try:
        body = json.loads(await request.body())
    except ValueError as exc:
        st.counters.failed += 1
        return _error(RouterError(400, f"request body is not JSON: {exc}"))
    if not isinstance(body, dict):
        st.counters.failed += 1
        return _error(RouterError(400, "request body must be a JSON object"))
    if body.get("n") not in (None, 1):
        st.counters.failed += 1
        return _error(RouterError(400, f"n={body.get('n')!r}: the disaggregated router serves one sequence per "
                                       "request (a prefill's KV is handed to one decode)"))
    try:
        await st.admission.acquire()
    except RouterError as exc:
        st.counters.rejected += 1
        return _error(exc)
    request_id = uuid.uuid4().hex
    headers = {k: v for k, v in request.headers.items() if k in _FORWARDED_HEADERS}
    headers |= {"content-type": "application/json", "x-request-id": request_id}
    out_headers = {"x-request-id": request_id}
    handed_over = False
    params: dict | None = None
    try:
        prefill_url, params = await st.proxy.prefill(path, body, headers, transfer_id=f"router-{request_id}")
        out_headers["x-router-prefill"] = prefill_url
        lease, resp = await st.proxy.open_decode(path, decode_payload(body, params), headers)
        out_headers["x-router-decode"] = lease.upstream.url
        if not body.get("stream"):
            raw = await st.proxy.read_all(lease, resp)
            st.counters.completed += 1
            return Response(raw, status_code=200, media_type=resp.content_type or "application/json",
                            headers=out_headers)
        relay = st.proxy.relay(lease, resp)
        closed = False

        async def on_close() -> None:
            nonlocal closed
            if closed:
                return
            closed = True
            await relay.aclose()  # runs the relay's clean-up if it stopped mid-way (client gone)
            resp.close()
            lease.release(ok=False)  # a no-op when the relay ran to its end and released the lease itself
            st.admission.release()
            if lease.ok:
                st.counters.completed += 1
            else:
                st.counters.failed += 1
                # The stream began, so a decode claimed the KV and its readers free it; this frees what it did not.
                await st.proxy.release_prefill(params, "the decode stream failed")

        handed_over = True
        return _RelayResponse(relay, on_close, status_code=200, media_type="text/event-stream", headers=out_headers)
    except RouterError as exc:
        st.counters.failed += 1
        if exc.server and exc.role:
            out_headers[f"x-router-{exc.role}"] = exc.server
        if params is not None:  # the prefill succeeded and holds KV no decode will claim (any decode failure,
            # including no decode server left to try after it)
            released = await st.proxy.release_prefill(params, exc.message)
            if released:
                exc = RouterError(exc.status, f"{exc.message}; {released}", exc.server, exc.role)
        return _error(exc, out_headers)
    except PassThrough as exc:
        st.counters.failed += 1
        out_headers[f"x-router-{exc.role}"] = exc.server
        if exc.role == "decode":
            released = await st.proxy.release_prefill(params, f"decode server answered {exc.status}")
            if released:
                out_headers["x-router-release"] = released
        return Response(exc.body, status_code=exc.status, media_type=exc.content_type, headers=out_headers)
    finally:
        if not handed_over:
            st.admission.release()


async def completions(request: Request) -> Response:
    return await _disaggregated(request, "/v1/completions")


async def chat_completions(request: Request) -> Response:
    return await _disaggregated(request, "/v1/chat/completions")


async def models(request: Request) -> Response:
    st = _state(request)
    upstream = st.decode.pick() or st.prefill.pick()
    if upstream is None:
        return _error(RouterError(503, st.decode.unavailable_reason()))
    try:
        async with st.session.get(upstream.url + "/v1/models",
                                  timeout=aiohttp.ClientTimeout(total=st.config.health_timeout_s)) as resp:
            return Response(await resp.read(), status_code=resp.status, media_type=resp.content_type)
    except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
        return _error(RouterError(502, f"{upstream.role} server {upstream.url} failed: {describe(exc)}"))


async def health(request: Request) -> Response:
    st = _state(request)
    missing = [p.unavailable_reason() for p in (st.prefill, st.decode) if not p.healthy()]
    if missing:
        return JSONResponse(error_body(503, "; ".join(missing)), status_code=503)
    return JSONResponse({"status": "ok", "prefill": len(st.prefill.healthy()), "decode": len(st.decode.healthy())})


async def status(request: Request) -> Response:
    st = _state(request)
    c = st.counters
    return JSONResponse({
        "prefill": st.prefill.snapshot(), "decode": st.decode.snapshot(),
        "inflight": st.admission.inflight, "queued": st.admission.queued,
        "received": c.received, "completed": c.completed, "failed": c.failed, "rejected": c.rejected,
        "kv_releases": dict(st.proxy.releases) if st.proxy is not None else {},
    })


def create_app(config: RouterConfig) -> Starlette:
    state = RouterState(config=config, prefill=ServerPool("prefill", config.prefill),
                        decode=ServerPool("decode", config.decode),
                        admission=Admission(config.max_inflight, config.max_queued, config.queue_timeout_s))

    @asynccontextmanager
    async def lifespan(app: Starlette):
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=config.keepalive_s)
        state.session = aiohttp.ClientSession(connector=connector)
        state.health = HealthChecker([state.prefill, state.decode], state.session,
                                     interval_s=config.health_interval_s, timeout_s=config.health_timeout_s)
        state.proxy = DisaggregatedProxy(config, state.session, state.prefill, state.decode, state.health)
        await state.health.check_all()  # serve knowing who is up (each check is bounded by health_timeout_s)
        state.health.start()
        try:
            yield
        finally:
            await state.health.stop()
            await state.session.close()
            state.proxy.close()

    app = Starlette(routes=[
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
    ], lifespan=lifespan)
    app.state.router = state
    return app
