"""A decode server killed mid-run behind the router: the requests it was serving get an error that names it (a 502,
or an error event for a stream that had begun; no request hangs), the others finish, and later requests go to the
surviving decode server. Runs last: the killed server stays dead for the rest of the package."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import httpx
import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake, pytest.mark.kills_servers]

LONG = 300  # tokens per request: the kill lands while both decode servers are generating
# Two non-streamed, then two streamed, ...: least-outstanding alternates the decode servers, so each gets both kinds.
STREAMED = [(i // 2) % 2 == 1 for i in range(12)]


def _status(serving) -> dict:
    with urllib.request.urlopen(serving.router.url + "/status", timeout=30) as resp:
        return json.loads(resp.read())


async def _one(client: httpx.AsyncClient, i: int, stream: bool, streaming: dict | None = None) -> dict:
    """One request through the router; a stream that begins records its decode server in `streaming[i]`."""
    body = {"model": "tiny", "prompt": prompt_of_length(20, offset=7000 + 50 * i), "max_tokens": LONG,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    t0 = time.monotonic()
    if not stream:
        resp = await client.post("/v1/completions", json=body)
        out = resp.json()
        ok = resp.status_code == 200
        return {"i": i, "stream": False, "status": resp.status_code, "decode": resp.headers.get("x-router-decode"),
                "error": None if ok else out["error"]["message"], "tokens": out["usage"]["completion_tokens"] if ok
                else 0, "seconds": time.monotonic() - t0}
    body["stream_options"] = {"include_usage": True}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        decode = resp.headers.get("x-router-decode")
        if resp.status_code != 200:  # refused before the stream began: an ordinary JSON error
            error = json.loads(await resp.aread())["error"]["message"]
            return {"i": i, "stream": True, "status": resp.status_code, "decode": decode, "error": error,
                    "tokens": 0, "seconds": time.monotonic() - t0}
        payloads = []
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                payloads.append(json.loads(line[len("data: "):]))
                if streaming is not None:
                    streaming.setdefault(i, decode)
    error = payloads[-1].get("error", {}).get("message") if payloads else "empty stream"
    tokens = next((p["usage"]["completion_tokens"] for p in payloads if p.get("usage")), 0)
    return {"i": i, "stream": True, "status": resp.status_code, "decode": decode, "error": error, "tokens": tokens,
            "seconds": time.monotonic() - t0}


def test_decode_server_killed_mid_run(serving):
    survivor, victim = serving.decodes
    timeout = httpx.Timeout(2 * serving.read_timeout_s)

    async def scenario() -> tuple[list[dict], list[dict]]:
        streaming: dict[int, str] = {}
        async with httpx.AsyncClient(base_url=serving.router.url, timeout=timeout) as client:
            inflight = [asyncio.ensure_future(_one(client, i, s, streaming)) for i, s in enumerate(STREAMED)]
            deadline = time.monotonic() + 120
            # Kill once a stream on the victim has begun and non-streamed requests are on it too.
            while not (victim.url in streaming.values()
                       and _server_outstanding(serving, victim.url) > sum(v == victim.url for v in streaming.values())):
                assert time.monotonic() < deadline, f"no stream began on {victim.url}: {_status(serving)}"
                await asyncio.sleep(0.02)
            victim.kill()
            first = await asyncio.gather(*inflight)
            later = await asyncio.gather(*(_one(client, 100 + i, s) for i, s in enumerate(STREAMED[:6])))
        return first, later

    first, later = asyncio.run(scenario())
    failed = [r for r in first if r["error"]]
    finished = [r for r in first if not r["error"]]
    print(f"killed {victim.url}: {len(failed)} in-flight requests failed "
          f"{[(r['stream'], r['status'], round(r['seconds'], 2)) for r in failed]} (streamed, status, s), "
          f"{len(finished)} finished on {survivor.url}, {len(later)} later ones all on it")
    # Both kinds failed on the victim: a non-streamed request (502) and a stream that had begun (error event).
    assert any(not r["stream"] and r["status"] == 502 for r in failed), failed
    assert any(r["stream"] and r["status"] == 200 and "mid-stream" in r["error"] for r in failed), failed
    assert finished, first
    for r in failed:  # an error naming the dead server, not a hang
        assert r["decode"] == victim.url and victim.url in r["error"], r
        assert r["status"] == (200 if "mid-stream" in r["error"] else 502), r
        assert r["seconds"] < serving.read_timeout_s, r  # well within the router's bound on a silent server
    for r in finished:
        assert (r["status"], r["decode"], r["tokens"]) == (200, survivor.url, LONG), r
    for r in later:
        assert (r["status"], r["decode"], r["error"], r["tokens"]) == (200, survivor.url, None, LONG), r
    gone = next(d for d in _status(serving)["decode"] if d["url"] == victim.url)
    assert gone["healthy"] is False and gone["outstanding"] == 0


def _server_outstanding(serving, url: str) -> int:
    return next(d["outstanding"] for d in _status(serving)["decode"] if d["url"] == url)
