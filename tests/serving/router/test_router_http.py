"""The router over real HTTP against fake prefill/decode servers: the two-step flow, streaming, load balancing,
health checks, timeouts, queue bounds and errors (the e2e tests run the same router against real vLLM servers)."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest


def _dead_url() -> str:
    """A loopback port nothing listens on (connections are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def _post(stack, router: str, path: str = "/v1/completions", **body) -> tuple[int, dict, dict]:
    body.setdefault("model", "fake")
    async with stack.session.post(router + path, json=body) as resp:
        return resp.status, resp.headers.copy(), await resp.json(content_type=None)


async def _status(stack, router: str) -> dict:
    async with stack.session.get(router + "/status") as resp:
        return await resp.json()


def _server(status: dict, url: str) -> dict:
    return next(s for role in ("prefill", "decode") for s in status[role] if s["url"] == url)


async def _sse_events(resp: aiohttp.ClientResponse):
    """The `data:` payloads of an SSE stream, as they arrive."""
    buf = b""
    async for chunk in resp.content.iter_any():
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                yield event[len(b"data: "):].decode()


def test_prefill_then_decode_with_the_returned_params(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        router = await stack.router([p.url], [d.url])
        status, headers, body = await _post(stack, router, prompt="hello", max_tokens=5, min_tokens=2,
                                            stream_options={"include_usage": True})
        assert status == 200, body
        transfer_id = f"router-{headers['x-request-id']}"
        assert body["choices"][0]["text"] == f"D|hello|{transfer_id}"
        assert (headers["x-router-prefill"], headers["x-router-decode"]) == (p.url, d.url)
        [pre] = p.requests
        assert pre["body"]["max_tokens"] == 1 and pre["body"]["stream"] is False
        assert "min_tokens" not in pre["body"] and "stream_options" not in pre["body"]
        assert pre["body"]["kv_transfer_params"] == {"do_remote_decode": True, "transfer_id": transfer_id}
        [dec] = d.requests
        assert dec["body"]["max_tokens"] == 5 and dec["body"]["min_tokens"] == 2
        assert dec["body"]["kv_transfer_params"] == {"do_remote_prefill": True, "remote_engine_id": "P",
                                                     "transfer_id": transfer_id}

    run(scenario)


def test_chat_stream_is_relayed_as_it_arrives(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.gate = asyncio.Event()
        router = await stack.router([p.url], [d.url])
        body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                "max_completion_tokens": 7}
        async with stack.session.post(router + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200 and resp.content_type == "text/event-stream"
            events = _sse_events(resp)
            # The decode server is parked after its first chunk: the client has it all the same.
            first = await asyncio.wait_for(events.__anext__(), 10)
            d.gate.set()
            rest = [e async for e in events]
        assert rest[-1] == "[DONE]"
        text = "".join(json.loads(e)["choices"][0]["delta"]["content"] for e in [first, *rest[:-1]])
        assert text == f"D|hi|router-{resp.headers['x-request-id']}"
        assert p.requests[0]["body"]["max_completion_tokens"] == 1 and p.requests[0]["body"]["max_tokens"] == 1
        assert p.requests[0]["path"] == d.requests[0]["path"] == "/v1/chat/completions"

    run(scenario)


def test_least_outstanding_spreads_held_streams(run):
    async def scenario(stack):
        p, d1, d2 = await stack.fake("P"), await stack.fake("D1"), await stack.fake("D2")
        gate = asyncio.Event()
        d1.gate = d2.gate = gate
        router = await stack.router([p.url], [d1.url, d2.url])
        responses = []
        for i in range(4):
            resp = await stack.session.post(router + "/v1/completions",
                                            json={"model": "fake", "prompt": f"p{i}", "stream": True})
            await resp.content.readuntil(b"\n\n")  # first chunk: the decode holds it open
            responses.append(resp)
        status = await _status(stack, router)
        assert [_server(status, u)["outstanding"] for u in (d1.url, d2.url)] == [2, 2]
        gate.set()
        for resp in responses:
            await resp.read()
            resp.release()
        await stack.wait_until(lambda: _idle(stack, router), what="router idle")
        status = await _status(stack, router)
        assert [_server(status, u)["ok"] for u in (d1.url, d2.url)] == [2, 2]

    run(scenario)


async def _idle(stack, router: str) -> bool:
    status = await _status(stack, router)
    return status["inflight"] == 0 and all(s["outstanding"] == 0 for s in status["prefill"] + status["decode"])


def test_prefill_failure_is_502_naming_the_server(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        p.mode = "error500"
        router = await stack.router([p.url], [d.url])
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 502
        assert p.url in body["error"]["message"] and "500" in body["error"]["message"]
        assert d.requests == []

    run(scenario)


def test_prefill_down_at_start_is_reported_and_the_other_serves(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        dead = _dead_url()
        router = await stack.router([dead, p.url], [d.url])
        async with stack.session.get(router + "/health") as resp:
            assert resp.status == 200
        entry = _server(await _status(stack, router), dead)
        assert entry["healthy"] is False and "GET /health failed" in entry["last_error"]
        for i in range(4):
            status, headers, _ = await _post(stack, router, prompt=f"q{i}")
            assert status == 200 and headers["x-router-prefill"] == p.url

    run(scenario)


def test_a_prefill_that_refuses_is_skipped_and_taken_out(run):
    async def scenario(stack):
        gone, p, d = await stack.fake("GONE"), await stack.fake("P"), await stack.fake("D")
        router = await stack.router([gone.url, p.url], [d.url], health_interval_s=3600)
        await stack.stop(gone.server)  # healthy at the router's start, refusing now
        for i in range(3):
            status, headers, body = await _post(stack, router, prompt=f"q{i}")
            assert status == 200, body
            assert headers["x-router-prefill"] == p.url
        entry = _server(await _status(stack, router), gone.url)
        assert entry["healthy"] is False and entry["failed"] == 1

    run(scenario)


def test_a_decode_server_that_refuses_is_skipped(run):
    async def scenario(stack):
        p, gone, d = await stack.fake("P"), await stack.fake("GONE"), await stack.fake("D")
        router = await stack.router([p.url], [gone.url, d.url], health_interval_s=3600)
        await stack.stop(gone.server)
        for i in range(3):
            status, headers, body = await _post(stack, router, prompt=f"q{i}")
            assert status == 200 and body["choices"][0]["text"].startswith("D|"), body
            assert headers["x-router-decode"] == d.url
        assert len(p.requests) == 3  # the request was prefilled once, then decoded on the next server

    run(scenario)


def test_health_checks_take_a_server_out_and_put_it_back(run):
    async def scenario(stack):
        p, d1, d2 = await stack.fake("P"), await stack.fake("D1"), await stack.fake("D2")
        router = await stack.router([p.url], [d1.url, d2.url], health_interval_s=0.1)

        async def d2_healthy(expected: bool) -> None:
            async def check() -> bool:
                return _server(await _status(stack, router), d2.url)["healthy"] is expected
            await stack.wait_until(check, what=f"D2 healthy={expected}")

        d2.health = 503
        await d2_healthy(False)
        for i in range(4):
            assert (await _post(stack, router, prompt=f"a{i}"))[1]["x-router-decode"] == d1.url
        d2.health = 200
        await d2_healthy(True)
        await stack.stop(d2.server)  # the process dies ...
        await d2_healthy(False)
        port = int(d2.url.rsplit(":", 1)[1])
        again = await stack.fake("D2-again", port=port)  # ... and comes back on its port
        await d2_healthy(True)
        decodes = {(await _post(stack, router, prompt=f"b{i}"))[1]["x-router-decode"] for i in range(4)}
        assert decodes == {d1.url, d2.url} and again.requests

    run(scenario)


def test_no_healthy_decode_is_503_naming_it(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.health = 503
        router = await stack.router([p.url], [d.url])
        async with stack.session.get(router + "/health") as resp:
            assert resp.status == 503
            assert "decode" in (await resp.json())["error"]["message"]
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 503 and d.url in body["error"]["message"]
        assert p.requests == []  # nothing is prefilled for a request no decode server can take

    run(scenario)


class _PrefillWorker:
    """A prefill worker's side channel (the connector's own server and messages) that frees what it is asked to."""

    def __init__(self) -> None:
        from ascend_kv_transfer.p2p.side_channel import SideChannelServer

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.address = ("127.0.0.1", s.getsockname()[1])
        self.asked: list = []
        self.channel = SideChannelServer(*self.address, self._handle)

    def _handle(self, message):
        from ascend_kv_transfer.p2p import schema

        self.asked.append((type(message).__name__, getattr(message, "transfer_id", None)))
        return schema.ReleaseResponse(released=True)


def _released_once(worker: _PrefillWorker, prefill, message: str, releases: dict) -> None:
    transfer_id = prefill.requests[0]["body"]["kv_transfer_params"]["transfer_id"]
    assert worker.asked == [("ReleaseRequest", transfer_id)], worker.asked
    assert "the prefill's KV blocks were released" in message, message
    assert releases["released"] == 1 and releases["failed"] == 0, releases


@pytest.mark.parametrize("way", ["gone", "unhealthy"])
def test_every_decode_failing_after_the_prefill_releases_the_prefill_kv(run, way):
    """The prefill has answered and holds the prompt's KV when no decode server is left: the error releases it over
    the prefill's side channel instead of leaving it pinned until the prefill's abort timeout. Two ways to run out:
    the only decode server is gone (502, every server tried), or health checks take it out while the prefill runs
    (503, none healthy)."""
    worker = _PrefillWorker()

    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        p.side_channel = worker.address
        if way == "gone":
            router = await stack.router([p.url], [d.url], health_interval_s=3600)
            await stack.stop(d.server)
        else:
            router = await stack.router([p.url], [d.url], health_interval_s=0.05)
            p.prefill_delay_s = 1.0
        posted = asyncio.ensure_future(_post(stack, router, prompt="x"))
        if way == "unhealthy":  # D turns unhealthy once the prefill has begun: the next checks take it out

            async def prefilling() -> bool:
                return bool(p.requests)
            await stack.wait_until(prefilling, timeout=10, what="the prefill request reached P")
            d.health = 503
        status, _, body = await posted
        message = body["error"]["message"]
        if way == "gone":
            assert status == 502 and "decode failed on every server tried" in message, body
        else:
            assert status == 503 and "no healthy decode server" in message, body
        _released_once(worker, p, message, (await _status(stack, router))["kv_releases"])

    try:
        run(scenario)
    finally:
        worker.channel.close()


def test_decode_dying_mid_stream_ends_the_stream_with_an_error_naming_it(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.mode = "die_mid_stream"
        router = await stack.router([p.url], [d.url], health_interval_s=3600)
        async with stack.session.post(router + "/v1/completions",
                                      json={"model": "fake", "prompt": "x", "stream": True}) as resp:
            assert resp.status == 200
            events = [e async for e in _sse_events(resp)]
        error = json.loads(events[-1])["error"]
        assert error["code"] == 502 and d.url in error["message"] and "mid-stream" in error["message"]
        assert json.loads(events[0])["choices"][0]["text"]  # the chunk before the failure did arrive
        assert _server(await _status(stack, router), d.url)["failed"] == 1

        async def back() -> bool:  # taken out on the failure, back at once: the check it triggered passed
            return _server(await _status(stack, router), d.url)["healthy"]
        await stack.wait_until(back, timeout=5, what="decode server checked again right after the failure")
        d.mode = "ok"
        assert (await _post(stack, router, prompt="y"))[0] == 200

    run(scenario)


def test_decode_500_is_502_and_hangs_are_504(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        router = await stack.router([p.url], [d.url], read_timeout_s=0.5, prefill_timeout_s=0.5)
        d.mode = "error500"
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 502 and d.url in body["error"]["message"]
        d.mode = "hang"
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 504 and d.url in body["error"]["message"]
        d.mode, p.mode = "ok", "hang"
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 504 and p.url in body["error"]["message"]

    run(scenario)


def test_queue_is_bounded(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.gate = asyncio.Event()
        router = await stack.router([p.url], [d.url], max_inflight=1, max_queued=1, queue_timeout_s=1.0)
        held = await stack.session.post(router + "/v1/completions",
                                        json={"model": "fake", "prompt": "a", "stream": True})
        await held.content.readuntil(b"\n\n")
        queued = asyncio.ensure_future(_post(stack, router, prompt="b"))
        await stack.wait_until(lambda: _queued(stack, router, 1), what="one request queued")
        status, _, body = await _post(stack, router, prompt="c")
        assert status == 503 and "--max-queued 1" in body["error"]["message"]
        status, _, body = await queued
        assert status == 503 and "no slot freed" in body["error"]["message"]
        d.gate.set()
        await held.read()
        held.release()
        assert (await _post(stack, router, prompt="d"))[0] == 200
        assert (await _status(stack, router))["rejected"] == 2

    run(scenario)


async def _queued(stack, router: str, n: int) -> bool:
    return (await _status(stack, router))["queued"] == n


def test_client_leaving_mid_stream_frees_everything(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.gate = asyncio.Event()
        router = await stack.router([p.url], [d.url], max_inflight=1)
        resp = await stack.session.post(router + "/v1/completions",
                                        json={"model": "fake", "prompt": "a", "stream": True})
        await resp.content.readuntil(b"\n\n")
        resp.close()  # the client goes away with the decode server still generating
        await stack.wait_until(lambda: _idle(stack, router), what="slot, lease and connection released")
        d.gate.set()
        assert (await _post(stack, router, prompt="b"))[0] == 200  # the one slot is free again

    run(scenario)


def test_client_closing_after_the_last_event_is_a_completed_request(run):
    """A client may close as soon as it read `data: [DONE]`, before the decode server's body ends: it got the whole
    answer, so neither the request nor the decode server counts a failure (and the prefill's KV is not released as
    for a failed stream)."""
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        d.linger = asyncio.Event()
        router = await stack.router([p.url], [d.url])
        before = await _status(stack, router)
        resp = await stack.session.post(router + "/v1/completions",
                                        json={"model": "fake", "prompt": "a", "stream": True})
        await resp.content.readuntil(b"data: [DONE]\n\n")
        resp.close()
        await stack.wait_until(lambda: _idle(stack, router), what="slot and lease released")
        d.linger.set()
        after = await _status(stack, router)
        assert after["completed"] - before["completed"] == 1 and after["failed"] == before["failed"], after
        decode = _server(after, d.url)
        assert decode["ok"] - _server(before, d.url)["ok"] == 1 and decode["failed"] == 0, decode

    run(scenario)


def test_client_errors_pass_through_and_n_is_refused(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        router = await stack.router([p.url], [d.url])
        status, _, body = await _post(stack, router, prompt="x", n=2)
        assert status == 400 and "n=2" in body["error"]["message"] and p.requests == []
        p.mode = "bad_request"
        status, _, body = await _post(stack, router, prompt="x")
        assert status == 400 and body["error"]["message"] == "max_tokens too large"
        async with stack.session.post(router + "/v1/completions", data=b"{not json") as resp:
            assert resp.status == 400

    run(scenario)


def test_prefill_without_params_lets_decode_compute_the_prompt(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        p.mode = "no_params"
        router = await stack.router([p.url], [d.url])
        status, _, body = await _post(stack, router, prompt="x", kv_transfer_params={"stale": True})
        assert status == 200 and body["choices"][0]["text"] == "D|x|None"
        assert "kv_transfer_params" not in d.requests[0]["body"]

    run(scenario)


def test_models_come_from_a_decode_server(run):
    async def scenario(stack):
        p, d = await stack.fake("P"), await stack.fake("D")
        router = await stack.router([p.url], [d.url])
        async with stack.session.get(router + "/v1/models") as resp:
            assert resp.status == 200 and (await resp.json())["data"][0]["owned_by"] == "D"

    run(scenario)
