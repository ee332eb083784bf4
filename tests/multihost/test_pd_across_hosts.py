"""Disaggregated prefill across hosts: `ascend-vllm serve` prefill on one host, decode on another, the router on a
third, AscendMooncakeConnector over TCP between the first two with `side_channel_host` set to each host's own
address. Answers equal the single engine's greedy tokens (the prefill server serving a request alone), the prefill
advertises its own host's address, the decode server took every prompt token's KV from the remote host, and the KV
bytes crossed the prefill-decode link."""

from __future__ import annotations

import json

import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

MAX_TOKENS = 12
GREEDY = {"max_tokens": MAX_TOKENS, "temperature": 0, "extra_body": {"ignore_eos": True}}
LENGTHS = [5, 129, 300]
# The tiny Llama's KV per token: 2 layers x (K, V) x 2 heads x 32 dims x 4 bytes (float32).
KV_BYTES_PER_TOKEN = 2 * 2 * 2 * 32 * 4


def kv_received_tokens(decode) -> float:
    """Prompt tokens the decode server took from a remote prefill (vLLM's own counter)."""
    total = 0.0
    for line in decode.get("/metrics", timeout=30)[1].decode().splitlines():
        if line.startswith("vllm:prompt_tokens_by_source_total") and 'source="external_kv_transfer"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


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
    before = kv_received_tokens(serving.decode)
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
    assert kv_received_tokens(serving.decode) - before == sum(LENGTHS)
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
