"""Small fake upstream servers for the router's own logic (no engine): real HTTP servers on 127.0.0.1, written with
the stack the router uses (Starlette on uvicorn), that answer like vLLM's OpenAI server with a P2P connector.

A fake answers a request carrying `kv_transfer_params.do_remote_decode` as a prefill (one token, params back) and
any other as a decode whose text names the fake, the prompt and the transfer id it was given, so a test can tell
which server did what. Knobs per fake: `health` (status of /health), `mode` (ok | error500 | bad_request | hang |
die_mid_stream | no_params), `gate` (a streamed answer waits there after its first chunk), `linger` (a stream's
body stays open there after its last event), `side_channel` (the address a prefill's params name for releasing its
held KV), `prefill_delay_s` (a prefill answers after it).
`run(scenario)` runs a coroutine with every fake and router it starts in one event loop, and stops them all, bounded.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ascend_vllm.router.app import create_app
from ascend_vllm.router.config import RouterConfig

SCENARIO_TIMEOUT_S = 60.0


class FakeUpstream:
    def __init__(self, name: str):
        self.name = name
        self.health = 200
        self.mode = "ok"
        self.gate: asyncio.Event | None = None
        self.linger: asyncio.Event | None = None  # a stream's body ends only once set, after its [DONE] event
        self.chunks = 3
        self.side_channel: tuple[str, int] | None = None  # where a prefill's params say its held KV can be released
        self.prefill_delay_s = 0.0
        self.requests: list[dict] = []
        self.url = ""
        self.server: uvicorn.Server | None = None

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/models", self._models, methods=["GET"]),
            Route("/v1/completions", self._generate, methods=["POST"]),
            Route("/v1/chat/completions", self._generate, methods=["POST"]),
        ])

    async def _health(self, request: Request) -> Response:
        return Response(status_code=self.health)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": self.name}]})

    async def _generate(self, request: Request) -> Response:
        body = json.loads(await request.body())
        self.requests.append({"path": request.url.path, "body": body, "headers": dict(request.headers)})
        if self.mode == "error500":
            return JSONResponse({"error": {"message": f"{self.name} broke"}}, status_code=500)
        if self.mode == "bad_request":
            return JSONResponse({"error": {"message": "max_tokens too large", "code": 400}}, status_code=400)
        if self.mode == "hang":
            await asyncio.sleep(3600)
        params = body.get("kv_transfer_params") or {}
        chat = request.url.path.endswith("/chat/completions")
        if params.get("do_remote_decode"):
            await asyncio.sleep(self.prefill_delay_s)
            returned = None if self.mode == "no_params" else {
                "do_remote_prefill": True, "remote_engine_id": self.name, "transfer_id": params["transfer_id"]}
            if returned is not None and self.side_channel is not None:
                returned |= {"remote_host": self.side_channel[0], "remote_port": self.side_channel[1]}
            return JSONResponse({"id": "p", "choices": [self._choice(chat, "first", "length")],
                                 "kv_transfer_params": returned})
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        text = f"{self.name}|{prompt}|{params.get('transfer_id')}"
        if not body.get("stream"):
            return JSONResponse({"id": "d", "choices": [self._choice(chat, text, "length")],
                                 "kv_transfer_params": None})
        return StreamingResponse(self._stream(chat, text), media_type="text/event-stream")

    async def _stream(self, chat: bool, text: str):
        size = -(-len(text) // self.chunks)
        for i in range(self.chunks):
            piece = text[i * size:(i + 1) * size]
            delta = {"delta": {"content": piece}} if chat else {"text": piece}
            yield b"data: " + json.dumps({"choices": [{"index": 0, **delta}]}).encode() + b"\n\n"
            if i == 0 and self.gate is not None:
                await self.gate.wait()
            if i == 0 and self.mode == "die_mid_stream":
                raise RuntimeError("fake decode server dies mid-stream")
        yield b"data: [DONE]\n\n"
        if self.linger is not None:
            await self.linger.wait()

    @staticmethod
    def _choice(chat: bool, text: str, finish: str) -> dict:
        if chat:
            return {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}
        return {"index": 0, "text": text, "finish_reason": finish}


def _bound_socket(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


class Stack:
    """Servers (fakes and routers) started in the running loop; `stop_all` shuts each down with a bound."""

    def __init__(self):
        self._servers: list[tuple[uvicorn.Server, asyncio.Task]] = []
        self.session: aiohttp.ClientSession | None = None

    async def _serve(self, app, port: int = 0) -> tuple[uvicorn.Server, int]:
        sock = _bound_socket(port)
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="auto"))
        task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
        self._servers.append((server, task))
        for _ in range(200):
            if server.started or task.done():
                break
            await asyncio.sleep(0.02)
        if not server.started:
            raise RuntimeError(f"server on port {port} did not start: {task.exception() if task.done() else ''}")
        return server, sock.getsockname()[1]

    async def fake(self, name: str, port: int = 0) -> FakeUpstream:
        fake = FakeUpstream(name)
        fake.server, bound = await self._serve(fake.app(), port)
        fake.url = f"http://127.0.0.1:{bound}"
        return fake

    async def stop(self, server: uvicorn.Server) -> None:
        for s, task in self._servers:
            if s is server:
                s.should_exit = True
                await asyncio.wait_for(task, 10)

    async def router(self, prefill: list[str], decode: list[str], **options) -> str:
        config = RouterConfig(prefill=tuple(prefill), decode=tuple(decode), **options)
        _, port = await self._serve(create_app(config))
        return f"http://127.0.0.1:{port}"

    @staticmethod
    async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, what: str = "") -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not await predicate():
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"not reached within {timeout} s: {what}")
            await asyncio.sleep(0.05)

    async def stop_all(self) -> None:
        if self.session is not None:
            await self.session.close()
        for server, _ in self._servers:
            server.should_exit = True
            server.force_exit = True
        await asyncio.wait_for(asyncio.gather(*(t for _, t in self._servers), return_exceptions=True), 15)


@pytest.fixture
def run():
    """`run(scenario)`: scenario(stack) runs in a fresh loop with an aiohttp session at `stack.session`."""

    def go(scenario: Callable[[Stack], Awaitable[None]]) -> None:
        async def main() -> None:
            stack = Stack()
            stack.session = aiohttp.ClientSession()
            try:
                await asyncio.wait_for(scenario(stack), SCENARIO_TIMEOUT_S)
            finally:
                await stack.stop_all()

        asyncio.run(main())

    return go
