"""The non-blocking side-channel client against a real ROUTER server on 127.0.0.1 (ZMQ only, no Mooncake)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.side_channel import (
    AsyncSideChannelClient,
    Deferred,
    SideChannelClient,
    SideChannelServer,
    SideChannelTimeout,
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _poll_until(client: AsyncSideChannelClient, pending, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not all(p.done for p in pending):
        assert time.monotonic() < deadline, "replies did not arrive in time"
        client.poll()
        time.sleep(0.001)


@pytest.fixture
def server():
    gate = threading.Event()
    gate.set()
    ready = threading.Event()  # what "park" waits for, like a claim waiting for the prefill's hold

    def handle(message):
        gate.wait(10)
        if isinstance(message, schema.ClaimRequest):
            if message.transfer_id == "bad":
                raise ValueError("no such thing")
            if message.transfer_id.startswith("park"):
                wait_s = float(message.transfer_id.split(":")[1])
                if not ready.is_set():
                    return Deferred(wait_s, schema.ClaimResponse(status=schema.ClaimStatus.NOT_READY))
                return schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=[[99]])
            return schema.ClaimResponse(status=schema.ClaimStatus.OK, block_ids=[[int(message.transfer_id)]])
        return schema.Ack()

    srv = SideChannelServer("127.0.0.1", _free_port(), handle)
    srv.gate, srv.ready = gate, ready
    yield srv
    gate.set()
    srv.close()


@pytest.fixture
def client():
    c = AsyncSideChannelClient(5.0)
    yield c
    c.close()


def test_replies_pair_with_their_requests_in_order(server, client):
    pending = [client.send(server.address, schema.ClaimRequest(transfer_id=str(i))) for i in range(20)]
    assert client.in_flight() == 20
    _poll_until(client, pending)
    assert [p.reply.block_ids for p in pending] == [[[i]] for i in range(20)]
    assert client.in_flight() == 0


def test_send_returns_at_once_while_the_peer_is_busy(server, client):
    server.gate.clear()
    start = time.monotonic()
    pending = client.send(server.address, schema.ClaimRequest(transfer_id="7"))
    client.poll()
    assert time.monotonic() - start < 0.5 and not pending.done
    server.gate.set()
    _poll_until(client, [pending])
    assert pending.reply.block_ids == [[7]]


def test_a_refusal_is_an_error_naming_the_request(server, client):
    bad = client.send(server.address, schema.ClaimRequest(transfer_id="bad"))
    good = client.send(server.address, schema.ClaimRequest(transfer_id="3"))
    _poll_until(client, [bad, good])
    assert isinstance(bad.error, RuntimeError) and "ClaimRequest" in str(bad.error)
    assert "no such thing" in str(bad.error)
    assert good.reply.block_ids == [[3]]


def test_a_silent_peer_fails_every_request_in_flight_after_the_timeout():
    address = ("127.0.0.1", _free_port())  # nothing listens here
    client = AsyncSideChannelClient(0.2)
    try:
        pending = [client.send(address, schema.ClaimRequest(transfer_id=str(i))) for i in range(3)]
        _poll_until(client, pending, timeout_s=5.0)
        assert all(isinstance(p.error, SideChannelTimeout) for p in pending)
        assert "within 0.2 s" in str(pending[0].error)
        assert client.in_flight() == 0
    finally:
        client.close()


def test_a_parked_request_is_answered_once_it_can_be_and_does_not_hold_up_later_ones(server, client):
    parked = client.send(server.address, schema.ClaimRequest(transfer_id="park:10"))
    later = client.send(server.address, schema.ClaimRequest(transfer_id="5"))
    _poll_until(client, [later])
    assert later.reply.block_ids == [[5]] and not parked.done
    server.ready.set()
    start = time.monotonic()
    # One request is parked: this (the engine's) thread answers it, or the server's thread got there first; never
    # both, and never anything else.
    assert server.serve_pending() in (0, 1)
    _poll_until(client, [parked])
    assert parked.reply.status == schema.ClaimStatus.OK and parked.reply.block_ids == [[99]]
    assert time.monotonic() - start < 5.0  # well before the 10 s the request may wait


def test_a_parked_request_hears_the_fallback_after_its_wait(server):
    client = AsyncSideChannelClient(5.0)
    blocking = SideChannelClient(5.0)
    try:
        start = time.monotonic()
        pending = client.send(server.address, schema.ClaimRequest(transfer_id="park:0.2"))
        _poll_until(client, [pending])
        assert pending.reply.status == schema.ClaimStatus.NOT_READY
        assert 0.2 <= time.monotonic() - start < 2.0
        # The blocking client (REQ) gets the same treatment through the same envelope echo.
        assert blocking.request(server.address, schema.ClaimRequest(transfer_id="park:0.1")).status == \
            schema.ClaimStatus.NOT_READY
    finally:
        client.close()
        blocking.close()
