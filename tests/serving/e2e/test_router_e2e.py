"""The `openai` client against `ascend-vllm router` in front of real servers: one prefill server (plus one listed
that never runs) and two decode servers, KV moved by AscendMooncakeConnector. Answers equal the single server's,
the decode servers really received the prompts' KV, streams are relayed while the decode server still generates,
and 64 concurrent requests are each answered exactly once."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

MAX_TOKENS = 12
# Greedy; a random model may pick EOS early, and token counts are asserted.
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
# Prompts ending before, on and after the 128-token block boundary; distinct offsets, so no prefix is shared.
LENGTHS = [5, 127, 128, 129, 300]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _status(serving) -> dict:
    return _get_json(serving.router.url + "/status")


def _idle_status(serving, timeout_s: float = 30.0) -> dict:
    """The router's /status once nothing is in flight: a stream an earlier test read to its end is counted when the
    router's relay closes, which can be a moment after the client saw `[DONE]` (a loaded machine once landed that
    count inside the next test's counter window)."""
    deadline = time.monotonic() + timeout_s
    while True:
        status = _status(serving)
        if status["inflight"] == 0 and status["queued"] == 0:
            return status
        assert time.monotonic() < deadline, f"the router still has requests in flight after {timeout_s} s: {status}"
        time.sleep(0.05)


def _server(status: dict, url: str) -> dict:
    return next(s for role in ("prefill", "decode") for s in status[role] if s["url"] == url)


def _kv_received_tokens(serving) -> float:
    """Prompt tokens the decode servers took from a remote prefill (vLLM's own counter)."""
    total = 0.0
    for server in serving.decodes:
        with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line:
                    total += float(line.rsplit(" ", 1)[1])
    return total


def test_router_reports_the_prefill_server_that_is_down(serving):
    assert _get_json(serving.router.url + "/health")["prefill"] == 1
    dead = _server(_status(serving), serving.dead_prefill_url)
    assert dead["healthy"] is False and "GET /health failed" in dead["last_error"] and dead["sent"] == 0


def test_completions_equal_a_single_servers_and_the_kv_moved(serving):
    direct, routed = serving.client(serving.prefill), serving.client(serving.router)
    before = _kv_received_tokens(serving)
    for n in LENGTHS:
        prompt = prompt_of_length(n, offset=1000 + n)
        raw = routed.completions.with_raw_response.create(model="tiny", prompt=prompt, **GREEDY)
        via_router = raw.parse()
        single = direct.completions.create(model="tiny", prompt=prompt, **GREEDY)
        assert via_router.choices[0].text == single.choices[0].text, n
        assert via_router.usage.completion_tokens == MAX_TOKENS
        assert raw.headers["x-router-prefill"] == serving.prefill.url
        assert raw.headers["x-router-decode"] in {d.url for d in serving.decodes}
    # Every prompt token reached a decode server over Mooncake: none was computed there.
    assert _kv_received_tokens(serving) - before == sum(LENGTHS)


def test_chat_equals_a_single_servers(serving):
    messages = [{"role": "user", "content": prompt_of_length(150, offset=2000)}]
    single = serving.client(serving.prefill).chat.completions.create(model="tiny", messages=messages,
                                                                     **GREEDY)
    routed = serving.client(serving.router).chat.completions.create(model="tiny", messages=messages,
                                                                    **GREEDY)
    assert routed.choices[0].message.content == single.choices[0].message.content
    assert routed.usage.completion_tokens == MAX_TOKENS


def test_streams_equal_a_single_servers(serving):
    """The same text, in several chunks (vLLM itself may put several tokens in one chunk when its output handler
    lags the engine, so chunk boundaries are not compared), and the usage chunk asked for."""
    direct, routed = serving.client(serving.prefill), serving.client(serving.router)
    prompt = prompt_of_length(140, offset=3000)
    messages = [{"role": "user", "content": prompt_of_length(60, offset=3500)}]
    greedy = GREEDY | {"max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}}

    def texts(client) -> tuple[list[str], int]:
        chunks = list(client.completions.create(model="tiny", prompt=prompt, **greedy))
        return [c.choices[0].text for c in chunks if c.choices and c.choices[0].text], chunks[-1].usage

    def deltas(client) -> tuple[list[str], int]:
        chunks = list(client.chat.completions.create(model="tiny", messages=messages, **greedy))
        return [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content], \
            chunks[-1].usage

    for pieces in (texts, deltas):
        (via_router, usage), (single, _) = pieces(routed), pieces(direct)
        assert "".join(via_router) == "".join(single) and len(via_router) > 1
        assert usage.completion_tokens == 64


def test_stream_chunks_reach_the_client_while_the_decode_server_generates(serving):
    """After the first chunk arrived, the decode server is still on the request (a router that buffered the
    answer would pass the first chunk only once the decode server was done, so it never shows one outstanding).
    A streaming router can still lose the race on a loaded machine (CI's other shard descheduled this client
    while the tiny model generated all 400 tokens), so up to three streams are tried; a buffering router fails
    all three."""
    seen = []
    for attempt in range(3):
        _idle_status(serving)
        chunks = iter(serving.client(serving.router).completions.create(
            model="tiny", prompt=prompt_of_length(10, offset=4000 + attempt), max_tokens=400, temperature=0,
            stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
        first = next(chunks)
        busy = sum(d["outstanding"] for d in _status(serving)["decode"])
        rest = list(chunks)
        assert first.choices[0].text
        assert rest[-1].usage.completion_tokens == 400
        seen.append(busy)
        if busy == 1:
            break
    assert seen[-1] == 1, f"no decode server held the request once its first chunk arrived, in {seen}"


def test_64_concurrent_requests_each_answered_once(serving):
    import openai

    prompts = [prompt_of_length(8 + 3 * i, offset=5000 + 37 * i) for i in range(64)]
    before = _idle_status(serving)

    async def run_all(url: str) -> list:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300) as client:
            return await asyncio.gather(*(client.completions.create(
                model="tiny", prompt=p, max_tokens=8, temperature=0) for p in prompts))

    routed = asyncio.run(run_all(serving.router.url))
    single = asyncio.run(run_all(serving.prefill.url))
    assert [r.choices[0].text for r in routed] == [s.choices[0].text for s in single]
    assert len({r.id for r in routed}) == 64
    after = _status(serving)
    assert after["completed"] - before["completed"] == 64 and after["failed"] == before["failed"]

    def delta(role: str, url: str, key: str) -> int:
        return _server(after, url)[key] - _server(before, url)[key]

    # Each request was prefilled once and decoded once (no retry sent it twice), the load spread on both decoders.
    assert delta("prefill", serving.prefill.url, "sent") == delta("prefill", serving.prefill.url, "ok") == 64
    per_decode = [delta("decode", d.url, "ok") for d in serving.decodes]
    assert sum(per_decode) == 64 and min(per_decode) > 0, per_decode
    assert sum(delta("decode", d.url, "sent") for d in serving.decodes) == 64
