"""The router's parts without HTTP: configuration checks, the least-outstanding choice, the prefill request, and
the `ascend-vllm router` / `ascend-vllm serve` command lines."""

from __future__ import annotations

import pytest

from ascend_vllm.cli import build_parser, main
from ascend_vllm.router.config import RouterConfig, RouterConfigError, normalize_url
from ascend_vllm.router.pool import ServerPool
from ascend_vllm.router.proxy import decode_payload, prefill_payload


@pytest.mark.parametrize(("given", "expected"), [
    ("http://127.0.0.1:8100", "http://127.0.0.1:8100"),
    ("http://127.0.0.1:8100/", "http://127.0.0.1:8100"),
    (" https://prefill-0.example:443 ", "https://prefill-0.example:443"),
    ("http://[::1]:8000", "http://[::1]:8000"),
])
def test_urls_are_normalized(given, expected):
    assert normalize_url("--prefill", given) == expected


@pytest.mark.parametrize(("given", "message"), [
    ("127.0.0.1:8100", "expected http://HOST:PORT"),
    ("http://127.0.0.1:8100/v1", "without a path"),
    ("http://127.0.0.1:99999", "bad port"),
])
def test_bad_urls_are_named(given, message):
    with pytest.raises(RouterConfigError, match=message) as info:
        normalize_url("--decode", given)
    assert "--decode" in str(info.value) and given in str(info.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"prefill": ()}, "at least one --prefill"),
    ({"decode": ("http://a:1", "http://a:1/")}, "--decode lists http://a:1 more than once"),
    ({"read_timeout_s": 0}, "--read-timeout 0"),
    ({"health_interval_s": float("inf")}, "--health-interval inf"),
    ({"max_inflight": 0}, "--max-inflight 0"),
    ({"max_queued": -1}, "--max-queued -1"),
    ({"port": 70000}, "--port 70000"),
])
def test_bad_settings_are_named(kwargs, message):
    base = {"prefill": ("http://p:1",), "decode": ("http://d:1",)}
    with pytest.raises(RouterConfigError, match=message):
        RouterConfig(**(base | kwargs))


def test_least_outstanding_with_ties_in_turn_and_only_healthy_servers():
    pool = ServerPool("decode", ("http://a:1", "http://b:1", "http://c:1"))
    for u in pool.upstreams:
        pool.set_health(u, True, None)
    a, b, c = pool.upstreams
    leases = [pool.lease() for _ in range(6)]
    assert [lease.upstream.outstanding for lease in leases[-3:]] == [2, 2, 2]
    assert {lease.upstream.url for lease in leases[:3]} == {a.url, b.url, c.url}
    for lease in leases:
        if lease.upstream is b:
            lease.release(ok=True)
    assert pool.pick() is b  # the least loaded
    pool.set_health(b, False, "GET /health answered 503")
    assert pool.pick() in (a, c)
    assert pool.pick(exclude={a.url}) is c
    pool.set_health(a, False, "x")
    pool.set_health(c, False, "y")
    assert pool.pick() is None
    assert "GET /health answered 503" in pool.unavailable_reason()
    assert (b.ok, b.outstanding) == (2, 0)


def test_prefill_request_is_one_token_unstreamed_and_asks_to_hold_the_kv():
    body = {"prompt": "x", "max_tokens": 50, "min_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}, "max_completion_tokens": 50, "temperature": 0}
    pre = prefill_payload(body, "t-1")
    assert pre == {"prompt": "x", "max_tokens": 1, "stream": False, "max_completion_tokens": 1, "temperature": 0,
                   "kv_transfer_params": {"do_remote_decode": True, "transfer_id": "t-1"}}
    assert body["max_tokens"] == 50  # the client's request is left as it came
    assert decode_payload(body, {"transfer_id": "t-1"})["kv_transfer_params"] == {"transfer_id": "t-1"}
    assert "kv_transfer_params" not in decode_payload(body | {"kv_transfer_params": {}}, None)


def test_router_command_line(capsys):
    args = build_parser().parse_args(["router", "--prefill", "http://127.0.0.1:8100", "--decode",
                                      "http://127.0.0.1:8200", "--decode", "http://127.0.0.1:8201",
                                      "--read-timeout", "9", "--max-inflight", "4"])
    assert (args.prefill, args.decode) == (["http://127.0.0.1:8100"],
                                           ["http://127.0.0.1:8200", "http://127.0.0.1:8201"])
    assert (args.read_timeout_s, args.max_inflight, args.host) == (9.0, 4, "127.0.0.1")
    assert main(["router", "--prefill", "http://p:1/v1", "--decode", "http://d:1"]) == 2
    assert "--prefill 'http://p:1/v1'" in capsys.readouterr().err


def test_serve_help_says_every_vllm_argument_passes_through():
    serve = build_parser()._subparsers._group_actions[0].choices["serve"]
    text = serve.format_help()
    assert "passes through" in text or "pass through" in text or "unchanged" in text
    assert "ascend-vllm serve MODEL --help=all" in text
    args = build_parser().parse_args(["serve", "/m", "--port", "8101", "--kv-transfer-config", "{}"])
    assert (args.model, args.vllm_args) == ("/m", ["--port", "8101", "--kv-transfer-config", "{}"])
