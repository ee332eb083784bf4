"""A peer whose transfer failed cools down (transfers to it fail fast, naming it and when it is retried), then exactly
one transfer probes it: success makes it healthy again, failure starts a new cool-down."""

import threading

import pytest

from ascend_kv_transfer.options import MooncakeOptions, OptionError, parse_options
from ascend_kv_transfer.p2p.broken_peers import BrokenPeerError, BrokenPeers

PEER = "10.0.0.1:16000"


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def peers(retry_s: float = 5.0) -> tuple[BrokenPeers, Clock]:
    clock = Clock()
    return BrokenPeers(retry_s, clock=clock, wall=lambda: 0.0), clock


def test_a_healthy_peer_is_admitted_without_a_probe():
    book, _ = peers()
    assert book.admit(PEER) is False and book.reason(PEER) is None
    assert book.succeeded(PEER) is False  # nothing to recover from


def test_cool_down_fails_fast_naming_the_peer_and_the_retry_then_one_probe_recovers():
    book, clock = peers(5.0)
    assert book.failed(PEER, "batch returned -1") == 5.0
    clock.now += 4.0
    with pytest.raises(BrokenPeerError, match=r"10\.0\.0\.1:16000 is broken \(batch returned -1\); not retrying "
                                              r"until \S+ \(in 1\.0 s\)"):
        book.admit(PEER)
    assert book.admit("10.0.0.2:16000") is False  # other peers are untouched
    clock.now += 1.0
    assert book.admit(PEER) is True  # the probe
    with pytest.raises(BrokenPeerError, match="probe transfer under way"):
        book.admit(PEER)  # only one probe at a time
    assert book.succeeded(PEER) is True
    assert book.admit(PEER) is False and book.reason(PEER) is None


def test_a_failed_probe_starts_a_new_cool_down():
    book, clock = peers(2.0)
    book.failed(PEER, "first")
    clock.now += 2.5
    assert book.admit(PEER) is True
    book.failed(PEER, "probe failed")
    clock.now += 1.9
    with pytest.raises(BrokenPeerError, match=r"\(probe failed\).*in 0\.1 s"):
        book.admit(PEER)
    clock.now += 0.1
    assert book.admit(PEER) is True


def test_concurrent_callers_after_the_cool_down_get_exactly_one_probe():
    book, clock = peers(1.0)
    book.failed(PEER, "cut")
    clock.now += 1.0
    results: list[object] = []
    lock = threading.Lock()

    def call():
        try:
            r: object = book.admit(PEER)
        except BrokenPeerError as e:
            r = e
        with lock:
            results.append(r)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results.count(True) == 1
    assert sum(isinstance(r, BrokenPeerError) for r in results) == 7


def test_cool_down_option():
    assert MooncakeOptions().broken_peer_retry_s == 5.0
    assert parse_options(MooncakeOptions, {"broken_peer_retry_s": 2}).broken_peer_retry_s == 2.0
    for bad in (0, -1.0):
        with pytest.raises(OptionError, match="broken_peer_retry_s"):
            parse_options(MooncakeOptions, {"broken_peer_retry_s": bad})
    with pytest.raises(ValueError, match="retry_after_s"):
        BrokenPeers(0)
