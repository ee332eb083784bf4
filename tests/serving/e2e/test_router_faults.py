"""A decode server killed mid-run behind the router: the requests it was serving get an error that names it (no
request hangs), the others finish, and later requests go to the surviving decode server. Runs last: the killed
server stays dead for the rest of the session."""

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


def _status(serving) -> dict:
    with urllib.request.urlopen(serving.router.url + "/status", timeout=30) as resp:
        return json.loads(resp.read())


async def _one(client: httpx.AsyncClient, i: int, stream: bool) -> dict:
    body = {"model": "tiny", "prompt": prompt_of_length(20, offset=7000 + 50 * i), "max_tokens": LONG,
            "temperature": 0, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    t0 = time.monotonic()
    if not stream:
        resp = await client.post("/v1/completions", json=body)
        out = resp.json()
        error = out.get("error", {}).get("message") if resp.status_code != 200 else None
        tokens = out["usage"]["completion_tokens"] if resp.status_code == 200 else 0
        return {"status": resp.status_code, "decode": resp.headers.get("x-router-decode"), "error": error,
                "tokens": tokens, "seconds": time.monotonic() - t0}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if resp.status_code != 200:  # refused before the stream began: an ordinary JSON error
            error = json.loads(await resp.aread())["error"]["message"]
            return {"status": resp.status_code, "decode": resp.headers.get("x-router-decode"), "error": error,
                    "tokens": 0, "seconds": time.monotonic() - t0}
        events = [line[len("data: "):] async for line in resp.aiter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e) for e in events if e != "[DONE]"]
    last = payloads[-1] if events and events[-1] != "[DONE]" else {}
    tokens = next((p["usage"]["completion_tokens"] for p in payloads if p.get("usage")), 0)
    return {"status": resp.status_code, "decode": resp.headers.get("x-router-decode"),
            "error": last.get("error", {}).get("message"), "tokens": tokens, "seconds": time.monotonic() - t0}


def test_decode_server_killed_mid_run(serving):
    survivor, victim = serving.decodes
    timeout = httpx.Timeout(2 * serving.read_timeout_s)

    async def scenario() -> tuple[list[dict], list[dict]]:
        async with httpx.AsyncClient(base_url=serving.router.url, timeout=timeout) as client:
            inflight = [asyncio.ensure_future(_one(client, i, stream=i % 2 == 1)) for i in range(8)]
            deadline = time.monotonic() + 120
            while not all(_status(serving)["decode"][k]["outstanding"] >= 2 for k in (0, 1)):
                assert time.monotonic() < deadline, f"requests never reached both decode servers: {_status(serving)}"
                await asyncio.sleep(0.05)
            victim.kill()
            first = await asyncio.gather(*inflight)
            later = await asyncio.gather(*(_one(client, 100 + i, stream=i % 2 == 1) for i in range(6)))
        return first, later

    first, later = asyncio.run(scenario())
    failed = [r for r in first if r["error"]]
    finished = [r for r in first if not r["error"]]
    print(f"killed {victim.url}: {len(failed)} in-flight requests failed in "
          f"{[round(r['seconds'], 2) for r in failed]} s ({[r['status'] for r in failed]}), {len(finished)} finished "
          f"on {survivor.url}, {len(later)} later ones all on it")
    assert failed and finished, first
    for r in failed:  # an error naming the dead server, not a hang (bounded by the client's timeout)
        assert r["decode"] == victim.url and victim.url in r["error"], r
        assert r["status"] == (200 if "mid-stream" in r["error"] else 502), r
        assert r["seconds"] < serving.read_timeout_s, r  # the router's own bound on a silent decode server
    for r in finished:
        assert (r["status"], r["decode"], r["tokens"]) == (200, survivor.url, LONG), r
    for r in later:
        assert (r["status"], r["decode"], r["error"], r["tokens"]) == (200, survivor.url, None, LONG), r
    gone = next(d for d in _status(serving)["decode"] if d["url"] == victim.url)
    assert gone["healthy"] is False and gone["outstanding"] == 0
