"""Disaggregated prefill across hosts: `ascend-vllm serve` prefill on one host, decode on another, the router on a
third, AscendMooncakeConnector over TCP between the first two with `side_channel_host` set to each host's own
address. Answers equal the single engine's greedy tokens (the prefill server serving a request alone), the prefill
advertises its own host's address, the decode server took every prompt token's KV from the remote host, and the KV
bytes crossed the prefill-decode link.

Then the prefill-decode link delayed (a 2 ms round trip, `Link.delay`): answers stay the single engine's with every
prompt token's KV pulled over it.

Last (the servers are shared in file order): the prefill-decode link cut while a request crosses it (`ip link set
... down` on both ends), then restored. The link is first rate-limited so the KV pull of a ~500-token prompt takes
seconds; the cut lands once part of the prompt's KV has crossed (the link's byte counter). The request ends with the
single engine's tokens (the decode host recomputes what it could not pull) or a named error within Mooncake's TCP
progress timeout, never hangs; the prefill host's held blocks are freed (its KV usage back to zero) within the abort
timeout; once the link is up again requests are answered again, and once the decode engine's cool-down for the broken
peer (`broken_peer_retry_s`) has passed their KV moves over the link again.

Then a host's server killed (SIGKILL, the whole process group: no shutdown runs) with two requests mid-pull, one
streamed, one not, the link slowed again so the kill lands while their KV crosses:
- the decode server: each request ends, via the router, with a named error (502 naming the decode server, as an
  answer or as the stream's error event) within seconds; the prefill host's held blocks are freed; the router's
  /health says no decode server is healthy; a fresh decode server on that host serves again, its KV pulled;
- the prefill server: each request ends with the single engine's tokens (recomputed on the decode host) or a named
  error within Mooncake's TCP progress timeout; the decode host's blocks are freed; the router refuses new requests
  with a named 503 at once; a fresh prefill server on that host serves again."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from ascend_testkit.hosts import tbf_burst_bytes, tbf_queue_delay_s
from ascend_testkit.models.tiny_llama import prompt_of_length
from ascend_testkit.servers import wait_for

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

MAX_TOKENS = 12
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
LENGTHS = [5, 129, 300]
# The tiny Llama's KV per token: 2 layers x (K, V) x 2 heads x 32 dims x 4 bytes (float32).
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4
# The fault test's prompt: 4 blocks x 128 KiB of KV. Past the 256 KiB burst the other 256 KiB take ~8 s at this rate:
# the window the cut must land in, wide enough for a poll starved by a loaded machine (at 500kbit it was ~3 s, and
# once the whole KV crossed before a poll saw it).
SLOW_RATE = "250kbit"
PAST_BURST = 32 << 10  # crossed beyond the burst: the pull is under way at the limited rate
LONG_PROMPT = 460
DURING_STALL: dict[str, float] = {}  # what the cut test saw while the pull was stalled
PROBES = 3  # cool-downs the decode engine gets to use the restored link again
# A dead server's sockets are reset by its host's kernel: the router (and the surviving engine's transfer) hear of
# the kill at once. The bound leaves room for a loaded 2-core machine.
ROUTER_SEES_A_RESET_S = 10.0



def test_prefill_advertises_its_own_hosts_address(serving):
    body = {
        "model": "tiny",
        "prompt": prompt_of_length(40, offset=11),
        "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "advertise-1"},
    }
    out = serving.client(serving.prefill).post("/completions", body=body, cast_to=object)
    params = out["kv_transfer_params"]
    prefill_host = serving.topo["prefill"].address
    assert params["remote_host"] == prefill_host and params["remote_bootstrap_addr"] == f"{prefill_host}:30300"
    assert prefill_host != "127.0.0.1"


def test_completions_across_hosts_equal_a_single_engines(serving):
    direct, routed = serving.client(serving.prefill), serving.client(serving.router)
    before = serving.decode.kv_received_tokens()
    sent_before = serving.topo["prefill"].bytes_sent("decode")
    for n in LENGTHS:
        prompt = prompt_of_length(n, offset=5000 + n)
        raw = routed.completions.with_raw_response.create(model="tiny", prompt=prompt, **GREEDY)
        via_router = raw.parse()
        single = direct.completions.create(model="tiny", prompt=prompt, **GREEDY)
        assert via_router.choices[0].text == single.choices[0].text, n
        assert via_router.usage.completion_tokens == MAX_TOKENS
        assert raw.headers["x-router-prefill"] == serving.prefill.url
        assert raw.headers["x-router-decode"] == serving.decode.url
    # Every prompt token's KV reached the decode host over Mooncake (none recomputed there) ...
    assert serving.decode.kv_received_tokens() - before == sum(LENGTHS)
    # ... and went over the prefill-decode link: whole blocks of 128 tokens, pulled by the decode host.
    sent = serving.topo["prefill"].bytes_sent("decode") - sent_before
    assert sent >= sum(LENGTHS) * KV_BYTES_PER_TOKEN, sent


def test_streamed_chat_across_hosts_equals_a_single_engines(serving):
    messages = [{"role": "user", "content": prompt_of_length(150, offset=6000)}]
    single = serving.client(serving.prefill).chat.completions.create(model="tiny", messages=messages, **GREEDY)
    stream = serving.client(serving.router).chat.completions.create(
        model="tiny", messages=messages, stream=True, **GREEDY
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == single.choices[0].message.content
    assert json.dumps(text)  # a real string came back


# Each direction of the delayed link holds packets this long (`Link.delay`, a TUN delay line: no netem here).
ONE_WAY_DELAY_S = 0.001


def _round_trip_s(serving) -> float:
    """Decode host -> the prefill's side channel: one TCP handshake, the fastest of ten."""
    return serving.topo["decode"].round_trip_s(serving.topo["prefill"].address, 30300)


def test_a_delayed_link_keeps_pd_equal_to_the_single_engine(serving):
    """The prefill-decode link with a 2 ms round trip (1 ms each way): every request still equals the single
    engine's tokens with all its prompt KV pulled over the link, and the delay goes when it is removed."""
    link = serving.topo.link("prefill", "decode")
    direct, routed = serving.client(serving.prefill), serving.client(serving.router)
    assert _round_trip_s(serving) < 2 * ONE_WAY_DELAY_S  # the veth link alone
    link.delay(ONE_WAY_DELAY_S)
    try:
        rtt = _round_trip_s(serving)
        assert rtt >= 2 * ONE_WAY_DELAY_S, rtt
        before = serving.decode.kv_received_tokens()
        for n in LENGTHS:
            prompt = prompt_of_length(n, offset=7000 + n)
            via_router = routed.completions.create(model="tiny", prompt=prompt, **GREEDY)
            single = direct.completions.create(model="tiny", prompt=prompt, **GREEDY)
            assert via_router.choices[0].text == single.choices[0].text, n
        assert serving.decode.kv_received_tokens() - before == sum(LENGTHS)  # pulled, none recomputed
    finally:
        link.delay(None)
    assert _round_trip_s(serving) < 2 * ONE_WAY_DELAY_S
    print(f"round trip over the delayed link: {rtt * 1e3:.2f} ms")




def test_link_cut_mid_transfer_ends_bounded_frees_blocks_and_recovers(serving):
    bounds, read_timeout_s = serving.kv_bounds, serving.read_timeout_s
    link = serving.topo.link("prefill", "decode")
    prompt = prompt_of_length(LONG_PROMPT, offset=9000)
    single = serving.client(serving.prefill).completions.create(model="tiny", prompt=prompt, **GREEDY)
    expected = single.choices[0].text
    # The first test's transfer nobody claims is held until abort_timeout_s: on a quick run it is still held here.
    wait_for(lambda: serving.prefill.kv_usage() == 0.0, bounds["abort_timeout_s"] + 10,
          "prefill KV idle")
    received_before = serving.decode.kv_received_tokens()
    wire_before = serving.topo["prefill"].bytes_sent("decode")
    kv_bytes = -(-LONG_PROMPT // 128) * 128 * KV_BYTES_PER_TOKEN
    mid_transfer = tbf_burst_bytes(SLOW_RATE) + PAST_BURST
    assert mid_transfer < kv_bytes // 2 + PAST_BURST * 2, "the burst lets most of the KV through at once"

    result: dict = {}

    def send() -> None:
        body = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True}
        t0 = time.monotonic()
        try:
            with httpx.Client(timeout=2 * read_timeout_s) as client:
                resp = client.post(serving.router.url + "/v1/completions", json=body)
            result.update(status=resp.status_code, body=resp.json())
        except httpx.HTTPError as exc:
            result.update(status=0, body={"error": {"message": repr(exc)}})
        result["seconds"] = time.monotonic() - t0
        result["ended_at"] = time.monotonic()

    _limit_slowly(serving, link)
    try:
        with serving_thread(serving.topo["router"], send) as sender:
            # Mid-transfer: more of the KV crossed than the bucket's burst lets through at once, not all of it.
            wait_for(
                lambda: serving.topo["prefill"].bytes_sent("decode") - wire_before > mid_transfer,
                60,
                "KV on the wire",
            )
            crossed = serving.topo["prefill"].bytes_sent("decode") - wire_before
            cut_at = time.monotonic()
            link.down()
            assert crossed < kv_bytes, f"the whole KV ({crossed} B) crossed before the cut"
            # A request needing no transfer, sent straight to the decode server while the pull is stalled.
            t0 = time.monotonic()
            serving.client(serving.decode).completions.create(model="tiny", prompt=prompt_of_length(8), **GREEDY)
            DURING_STALL["plain_request_s"] = time.monotonic() - t0
            DURING_STALL["plain_request_done_at"] = time.monotonic()
            print(f"a plain request on the decode server during the stalled pull took {time.monotonic() - t0:.1f} s")
            sender.join(timeout=2 * read_timeout_s + 10)
            assert not sender.is_alive(), "the request hung past the router's bounds"
        ended_after = time.monotonic() - cut_at
        DURING_STALL["request_ended_at"] = time.monotonic()
        DURING_STALL["stalled_request_ended_at"] = result["ended_at"]
        print(f"request ended {ended_after:.1f} s after the cut: {result['status']} {str(result['body'])[:300]}")
        # A stalled pull ends when Mooncake's TCP transport gives up on the connection (MC_TCP_PROGRESS_TIMEOUT_SEC);
        # the connector's own bounds cover the side-channel steps around it.
        bound = serving.progress_timeout_s + 2 * bounds["handshake_timeout_s"] + 5
        if result["status"] == 200:
            # Recomputed on the decode host: the single engine's tokens.
            assert result["body"]["choices"][0]["text"] == expected
            assert ended_after < bound, ended_after
        else:  # a named error, within the router's read timeout
            assert result["body"]["error"]["message"], result
            assert ended_after < read_timeout_s + 5, ended_after
        # The prefill host's held blocks are freed (the transfer expires unclaimed or unfinished).
        freed_in = wait_for(
            lambda: serving.prefill.kv_usage() == 0.0,
            bounds["abort_timeout_s"] + 15,
            "prefill blocks freed",
        )
        print(f"prefill KV usage back to 0 {freed_in:.1f} s after the request ended")
    finally:
        link.up()
        link.limit(None)

    # Serving resumes over the restored link: the single engine's answer through the router.
    wait_for(lambda: json.loads(serving.router.get("/health")[1] or b"{}").get("decode") == 1, 30, "router healthy")
    again = prompt_of_length(200, offset=9500)
    routed = serving.client(serving.router).completions.create(model="tiny", prompt=again, **GREEDY)
    direct = serving.client(serving.prefill).completions.create(model="tiny", prompt=again, **GREEDY)
    assert routed.choices[0].text == direct.choices[0].text
    print(f"KV tokens the decode host received before the cut: {received_before}")


def test_decode_engine_serves_other_requests_while_a_pull_is_stalled(serving):
    assert "plain_request_s" in DURING_STALL, ("measured by test_link_cut_mid_transfer_ends_bounded_frees_blocks_and_"
                                               "recovers, which did not get that far (run it first, in this session)")
    # Served while the pull was still stalled: done before the stalled request ended (its pull cannot give up
    # sooner than Mooncake's progress timeout after the cut). A time bound (it was < 2 s) measured the machine:
    # CI once took 2.007 s on a loaded 2-core host.
    assert DURING_STALL["plain_request_done_at"] < DURING_STALL["stalled_request_ended_at"], DURING_STALL
    assert DURING_STALL["plain_request_s"] < serving.progress_timeout_s, DURING_STALL


def test_kv_moves_again_once_the_link_is_restored(serving):
    from ascend_kv_transfer.options import MooncakeOptions

    assert serving.topo.link("prefill", "decode").is_up()
    # The failed pull ended by the time its request did; the decode engine probes the peer once its cool-down is over.
    # Mooncake may still refuse the first probe right after its connection was dropped (seen: once in three runs): a
    # failed probe starts a new cool-down, and a later probe gets through; bounded to PROBES cool-downs.
    retry_s = MooncakeOptions().broken_peer_retry_s
    ended = DURING_STALL.get("request_ended_at", 0.0)
    for attempt in range(1, PROBES + 1):
        time.sleep(max(0.0, ended + retry_s + 0.5 - time.monotonic()))
        received = serving.decode.kv_received_tokens()
        prompt = prompt_of_length(200, offset=9700 + 300 * attempt)
        routed = serving.client(serving.router).completions.create(model="tiny", prompt=prompt, **GREEDY)
        ended = time.monotonic()
        direct = serving.client(serving.prefill).completions.create(model="tiny", prompt=prompt, **GREEDY)
        assert routed.choices[0].text == direct.choices[0].text  # pulled or recomputed, the same answer
        if serving.decode.kv_received_tokens() - received == 200:
            print(f"KV moved again on probe {attempt}")
            return
    raise AssertionError(f"no KV moved over the restored link in {PROBES} probes, {retry_s} s apart")


class serving_thread:  # noqa: N801 - used as a context manager like a function
    """A thread whose network namespace is `host`'s (setns is per thread), joined on exit."""

    def __init__(self, host, target):
        from ascend_testkit.servers import inside

        def run():
            with inside(host):
                target()

        self.thread = threading.Thread(target=run, daemon=True)

    def __enter__(self) -> threading.Thread:
        self.thread.start()
        return self.thread

    def __exit__(self, *exc) -> None:
        self.thread.join(timeout=150)


# A host killed: after the link tests above (the restarts put fresh servers in place of the killed ones).


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


def _limit_slowly(serving, link) -> None:
    """Limit `link` to SLOW_RATE, whose queue the servers' side-channel bound must outlast (conftest.KV_BOUNDS)."""
    queued_s = tbf_queue_delay_s(SLOW_RATE)
    assert serving.kv_bounds["handshake_timeout_s"] > queued_s, (
        f"a side-channel reply may wait {queued_s:.1f} s behind KV bytes at {SLOW_RATE}: raise the handshake bound")
    link.limit(SLOW_RATE)


def _kill_mid_pull(serving, role: str, prompts: list[str]) -> tuple[list[dict], float]:
    """Send `prompts` through the router with the prefill-decode link slowed, SIGKILL the `role` server once their
    KV is crossing, return how each request ended and seconds after the kill."""
    prefill_host = serving.topo["prefill"]
    link = serving.topo.link("prefill", "decode")
    wire_before = prefill_host.bytes_sent("decode")
    _limit_slowly(serving, link)
    try:
        sent = InFlight(serving, prompts, timeout_s=2 * serving.read_timeout_s)
        wait_for(lambda: prefill_host.bytes_sent("decode") - wire_before > tbf_burst_bytes(SLOW_RATE) + PAST_BURST,
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
    wait_for(lambda: _router_health(serving.router)[0] == 200, 30, "router healthy again")
    prompt = prompt_of_length(200, offset=offset)
    received = serving.decode.kv_received_tokens()
    routed = serving.client(serving.router).completions.create(model="tiny", prompt=prompt, **GREEDY)
    direct = serving.client(serving.prefill).completions.create(model="tiny", prompt=prompt, **GREEDY)
    assert routed.choices[0].text == direct.choices[0].text
    return serving.decode.kv_received_tokens() - received


def test_decode_host_killed_mid_pull(serving, restart_on):
    bounds = serving.kv_bounds
    prompts = [prompt_of_length(LONG_PROMPT, offset=11000 + 500 * i) for i in range(2)]
    wait_for(lambda: serving.prefill.kv_usage() == 0.0, bounds["abort_timeout_s"] + 10, "prefill KV idle")
    results, killed_at = _kill_mid_pull(serving, "decode", prompts)
    for r in results:
        # 502 naming the decode server (a stream's 200 headers may have gone out before the kill: then its error
        # event); 503 naming it for a request whose prefill ended after the router took the server out.
        assert r["status"] in (200, 502, 503) and "text" not in r, r
        assert "decode" in r["error"] and serving.decode.url in r["error"], r
        assert r["after_kill_s"] < ROUTER_SEES_A_RESET_S, r
    freed_s = wait_for(lambda: serving.prefill.kv_usage() == 0.0, bounds["abort_timeout_s"] + 10,
                       "prefill blocks freed")
    print(f"prefill KV usage back to 0 {time.monotonic() - killed_at:.1f} s after the kill "
          f"({freed_s:.1f} s after the requests ended)")

    wait_for(lambda: _router_health(serving.router)[0] == 503, 10, "router reports the dead decode server")
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
        wait_for(lambda s=server: s.kv_usage() == 0.0, bounds["abort_timeout_s"] + 10, f"{server.name} KV idle")
    results, killed_at = _kill_mid_pull(serving, "prefill", prompts)
    # A pull from a dead peer fails as its connection is reset; a stalled one at Mooncake's TCP progress timeout.
    bound = serving.progress_timeout_s + 2 * bounds["handshake_timeout_s"] + 5
    for r, text in zip(results, expected, strict=True):
        if "text" in r:  # recomputed on the decode host: the single engine's tokens
            assert r["text"] == text, r
        else:
            assert r["error"], r
        assert r["after_kill_s"] < bound, r
    freed_s = wait_for(lambda: serving.decode.kv_usage() == 0.0, bounds["abort_timeout_s"] + 10, "decode blocks freed")
    print(f"decode KV usage back to 0 {time.monotonic() - killed_at:.1f} s after the kill "
          f"({freed_s:.1f} s after the requests ended)")

    wait_for(lambda: _router_health(serving.router)[0] == 503, 10, "router reports the dead prefill server")
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
