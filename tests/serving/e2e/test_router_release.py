"""A decode leg that fails after the prefill succeeded: the router releases the prefill's held KV blocks over the
prefill's side channel at once, instead of leaving them pinned until the connector's abort timeout (30 s here), and
says so. The decode servers refuse the request themselves (min_tokens above max_tokens: the router's prefill request
drops min_tokens and asks for one token, so only the decode leg is invalid), so no server is harmed."""

from __future__ import annotations

import json
import time
import urllib.request

import httpx
import pytest

from ascend_testkit.models.tiny_llama import prompt_of_length

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as resp:
        return json.loads(resp.read())


def _kv_usage(server) -> float:
    with urllib.request.urlopen(server.url + "/metrics", timeout=30) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("vllm:kv_cache_usage_perc"):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{server.url}/metrics has no vllm:kv_cache_usage_perc")


def test_a_failed_decode_leg_releases_the_prefill_kv_at_once(serving):
    before = _get_json(serving.router.url + "/status")["kv_releases"]
    body = {"model": "tiny", "prompt": prompt_of_length(300, offset=9100), "max_tokens": 8, "min_tokens": 16,
            "temperature": 0}
    t0 = time.monotonic()
    resp = httpx.post(serving.router.url + "/v1/completions", json=body, timeout=60)
    assert resp.status_code == 400, resp.text
    assert resp.headers["x-router-release"] == "the prefill's KV blocks were released", dict(resp.headers)
    after = _get_json(serving.router.url + "/status")["kv_releases"]
    assert after["released"] == before["released"] + 1 and after["failed"] == before["failed"], (before, after)
    # The 3 blocks the prompt filled are free within seconds, far inside the prefill's 30 s abort timeout.
    deadline = time.monotonic() + 10
    while _kv_usage(serving.prefill) > 0:
        assert time.monotonic() < deadline, f"prefill KV still in use {time.monotonic() - t0:.1f} s after the error"
        time.sleep(0.1)
    assert time.monotonic() - t0 < 15
