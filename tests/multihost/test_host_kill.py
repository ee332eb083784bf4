"""A host's server killed (SIGKILL, the whole process group: no shutdown runs) with disaggregated requests in flight,
on the three hosts of `hosts_serving` (prefill, decode, router; conftest.py).

The prefill-decode link is first rate-limited so the KV pulls of two ~460-token prompts take seconds; the kill lands
once part of their KV has crossed (the link's byte counter): both requests are mid-transfer, one streamed, one not.

- Decode host killed: each request ends, via the router, with a named error (502 naming the decode server, as an
  answer or as the stream's error event) within a few seconds, never hangs; the prefill host's held blocks are freed
  (its KV usage back to 0 on /metrics); the router's /health says no decode server is healthy; a fresh decode server
  started on that host serves again through the router, its KV pulled from the prefill host.
- Prefill host killed: each request ends with the single engine's tokens (the decode host recomputes what it could
  not pull) or a named error, within Mooncake's TCP progress timeout; the decode host's blocks are freed; the router
  reports the dead prefill and answers new requests with a named 503 at once; a fresh prefill server started on
  that host serves again through the router.
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from ascend_testkit.hosts import tbf_burst_bytes
from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

MAX_TOKENS = 12
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
LONG_PROMPT = 460  # 4 blocks of 128 KiB of KV each
SLOW_RATE = "250kbit"  # past the 256 KiB burst, the rest of two prompts' KV takes ~25 s: the kill lands mid-pull
PAST_BURST = 32 << 10
# A dead server's sockets are reset by its host's kernel: the router (and the surviving engine's transfer) hear of
# the kill at once. The bound leaves room for a loaded 2-core machine.
ROUTER_SEES_A_RESET_S = 10.0


def _metric(server, name: str) -> float:
    for line in server.get("/metrics", timeout=30)[1].decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{server.name} reports no {name}")


def _kv_idle(server) -> bool:
    return _metric(server, "vllm:kv_cache_usage_perc") == 0.0


def _kv_received_tokens(decode) -> float:
    total = 0.0
    for line in decode.get("/metrics", timeout=30)[1].decode().splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def _wait(predicate, timeout: float, what: str) -> float:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return time.monotonic() - t0


def _router_health(router) -> tuple[int, dict]:
    status, body = router.get("/health", timeout=5)
    return status, json.loads(body or b"{}")


class InFlight:
    """Requests sent to the router from threads on the router's host; each records how and when it ended."""

    def __init__(self, serving, prompts: list[str], timeout_s: float):
        from ascend_testkit.servers import inside

        self.results: list[dict] = [{} for _ in prompts]
        self.threads = []
        for i, prompt in enumerate(prompts):
            body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True, "stream": i % 2 == 1}

            def run(body=body, out=self.results[i]):
                with inside(serving.topo["router"]), httpx.Client(timeout=timeout_s) as client:
                    try:
                        _send(client, serving.router.url + "/v1/completions", body, out)
                    except httpx.HTTPError as exc:
                        out.update(status=0, error=repr(exc))
                out["ended_at"] = time.monotonic()

            self.threads.append(threading.Thread(target=run, daemon=True))
        for t in self.threads:
            t.start()

    def join(self, timeout: float) -> list[dict]:
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [i for i, t in enumerate(self.threads) if t.is_alive()]
        assert not hung, f"requests {hung} hung past {timeout} s: {self.results}"
        return self.results


def _send(client: httpx.Client, url: str, body: dict, out: dict) -> None:
    """A completion: `text` when it was answered whole, else `status` and the `error` message it ended with."""
    if not body["stream"]:
        resp = client.post(url, json=body)
        data = resp.json()
        out.update(status=resp.status_code)
        if resp.status_code == 200:
            out["text"] = data["choices"][0]["text"]
        else:
            out["error"] = data["error"]["message"]
        return
    text, done = [], False
    with client.stream("POST", url, json=body) as resp:
        out["status"] = resp.status_code
        if resp.status_code != 200:
            out["error"] = json.loads(resp.read())["error"]["message"]
            return
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            event = json.loads(line[len("data: "):])
            if "error" in event:
                out["error"] = event["error"]["message"]
                return
            text.append(event["choices"][0]["text"])
    if done:
        out["text"] = "".join(text)
    else:
        out["error"] = "the stream ended without [DONE] or an error event"


def _kill_mid_pull(serving, role: str, prompts: list[str]) -> tuple[list[dict], float]:
    """Send `prompts` through the router with the prefill-decode link slowed, SIGKILL the `role` server once their
    KV is crossing, return how each request ended and seconds after the kill."""
    prefill_host = serving.topo["prefill"]
    link = serving.topo.link("prefill", "decode")
    wire_before = prefill_host.bytes_sent("decode")
    link.limit(SLOW_RATE)
    try:
        sent = InFlight(serving, prompts, timeout_s=2 * serving.read_timeout_s)
        _wait(lambda: prefill_host.bytes_sent("decode") - wire_before > tbf_burst_bytes(SLOW_RATE) + PAST_BURST,
              60, "KV on the wire")
        assert not any("ended_at" in r for r in sent.results), f"a request ended before the kill: {sent.results}"
        killed_at = time.monotonic()
        getattr(serving, role).kill()
        results = sent.join(2 * serving.read_timeout_s + 10)
    finally:
        link.limit(None)
    for r in results:
        r["after_kill_s"] = round(r["ended_at"] - killed_at, 2)
    print(f"{role} killed: requests ended {[r['after_kill_s'] for r in results]} s after the kill: "
          f"{[(r['status'], r.get('error', r.get('text'))) for r in results]}")
    return results, killed_at


def _serves_again(serving, offset: int) -> float:
    """A request through the router equals the prefill server's own answer; returns the prompt tokens whose KV the
    decode server pulled for it."""
    _wait(lambda: _router_health(serving.router)[0] == 200, 30, "router healthy again")
    prompt = prompt_of_length(200, offset=offset)
    received = _kv_received_tokens(serving.decode)
    routed = serving.client(serving.router).completions.create(model="tiny", prompt=prompt, **GREEDY)
    direct = serving.client(serving.prefill).completions.create(model="tiny", prompt=prompt, **GREEDY)
    assert routed.choices[0].text == direct.choices[0].text
    return _kv_received_tokens(serving.decode) - received


def test_decode_host_killed_mid_pull(serving, restart_on):
    bounds = serving.kv_bounds
    prompts = [prompt_of_length(LONG_PROMPT, offset=11000 + 500 * i) for i in range(2)]
    _wait(lambda: _kv_idle(serving.prefill), bounds["abort_timeout_s"] + 10, "prefill KV idle")
    results, killed_at = _kill_mid_pull(serving, "decode", prompts)
    for r in results:
        # 502 naming the decode server (a stream's 200 headers may have gone out before the kill: then its error
        # event); 503 naming it for a request whose prefill ended after the router took the server out.
        assert r["status"] in (200, 502, 503) and "text" not in r, r
        assert "decode" in r["error"] and serving.decode.url in r["error"], r
        assert r["after_kill_s"] < ROUTER_SEES_A_RESET_S, r
    freed_s = _wait(lambda: _kv_idle(serving.prefill), bounds["abort_timeout_s"] + 10, "prefill blocks freed")
    print(f"prefill KV usage back to 0 {time.monotonic() - killed_at:.1f} s after the kill "
          f"({freed_s:.1f} s after the requests ended)")

    _wait(lambda: _router_health(serving.router)[0] == 503, 10, "router reports the dead decode server")
    status, body = _router_health(serving.router)
    assert "no healthy decode server" in body["error"]["message"] and serving.decode.url in body["error"]["message"]
    dead = serving.router.get_json("/status")["decode"][0]
    assert dead["url"] == serving.decode.url and not dead["healthy"] and dead["last_error"], dead

    t0 = time.monotonic()
    restart_on("decode")
    print(f"a fresh decode server was healthy {time.monotonic() - t0:.1f} s after its start")
    assert _serves_again(serving, offset=12000) == 200  # its KV was pulled from the prefill host


def test_prefill_host_killed_mid_pull(serving, restart_on):
    bounds = serving.kv_bounds
    prompts = [prompt_of_length(LONG_PROMPT, offset=13000 + 500 * i) for i in range(2)]
    direct = serving.client(serving.prefill)
    expected = [direct.completions.create(model="tiny", prompt=p, **GREEDY).choices[0].text for p in prompts]
    for server in (serving.prefill, serving.decode):
        _wait(lambda s=server: _kv_idle(s), bounds["abort_timeout_s"] + 10, f"{server.name} KV idle")
    results, killed_at = _kill_mid_pull(serving, "prefill", prompts)
    # A pull from a dead peer fails as its connection is reset; a stalled one at Mooncake's TCP progress timeout.
    bound = serving.progress_timeout_s + 2 * bounds["handshake_timeout_s"] + 5
    for r, text in zip(results, expected, strict=True):
        if "text" in r:  # recomputed on the decode host: the single engine's tokens
            assert r["text"] == text, r
        else:
            assert r["error"], r
        assert r["after_kill_s"] < bound, r
    freed_s = _wait(lambda: _kv_idle(serving.decode), bounds["abort_timeout_s"] + 10, "decode blocks freed")
    print(f"decode KV usage back to 0 {time.monotonic() - killed_at:.1f} s after the kill "
          f"({freed_s:.1f} s after the requests ended)")

    _wait(lambda: _router_health(serving.router)[0] == 503, 10, "router reports the dead prefill server")
    message = _router_health(serving.router)[1]["error"]["message"]
    assert "no healthy prefill server" in message and serving.prefill.url in message
    # New requests are refused by name at once, not queued behind the dead server.
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as raised:
        serving.client(serving.router).completions.create(model="tiny", prompt=prompt_of_length(20, offset=13900),
                                                          **GREEDY)
    assert raised.value.status_code == 503 and "no healthy prefill server" in str(raised.value)
    assert time.monotonic() - t0 < 5

    t0 = time.monotonic()
    restart_on("prefill")
    print(f"a fresh prefill server was healthy {time.monotonic() - t0:.1f} s after its start")
    pulled = _serves_again(serving, offset=14000)
    print(f"the first request after the restart pulled {pulled} prompt tokens' KV")
