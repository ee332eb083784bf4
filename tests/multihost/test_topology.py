"""The testkit's hosts (`ascend_testkit.hosts`): three namespaces, a-b and b-c linked, a-c not. A TCP connection goes
over a link and nowhere else, a cut link refuses until it is restored, a rate-limited link keeps its rate, and a
delayed link adds its round trip (a TUN delay line: this kernel has no netem) until the delay is removed."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from ascend_testkit.hosts import Topology
from ascend_testkit.servers import inside

PORT = 40100


@pytest.fixture(scope="module")
def topo():
    with Topology(["a", "b", "c"], links=[("a", "b"), ("b", "c")]) as t:
        yield t


def _listen(host) -> socket.socket:
    with inside(host):  # the socket stays in host's namespace after the thread leaves it
        srv = socket.create_server((host.address, PORT))
    srv.settimeout(5)
    return srv


def _connect(src, dst, timeout: float = 2.0) -> str:
    """'ok' or the error a connection from src to dst's listener met."""
    with inside(src):
        try:
            with socket.create_connection((dst.address, PORT), timeout=timeout) as conn:
                assert conn.getsockname()[0] == src.address  # the source address is src's own
                return "ok"
        except OSError as exc:
            return type(exc).__name__ + ": " + str(exc)


def test_hosts_hold_only_their_links(topo):
    assert [topo[n].address for n in "abc"] == ["10.211.0.1", "10.211.0.2", "10.211.0.3"]
    assert sorted(topo["a"].interfaces()) == ["lo", "to-b"]
    assert sorted(topo["b"].interfaces()) == ["lo", "to-a", "to-c"]
    assert len({topo[n].pid for n in "abc"}) == 3


def test_linked_hosts_reach_each_other_and_no_one_else(topo):
    srv_b, srv_c = _listen(topo["b"]), _listen(topo["c"])
    try:
        assert _connect(topo["a"], topo["b"]) == "ok"
        assert _connect(topo["c"], topo["b"]) == "ok"
        assert _connect(topo["b"], topo["c"]) == "ok"
        assert "unreachable" in _connect(topo["a"], topo["c"])  # no a-c link, no route
        # The machine's own namespace has none of these addresses: a connection from here fails too.
        with socket.socket() as s:
            s.settimeout(1)
            assert s.connect_ex((topo["b"].address, PORT)) != 0
    finally:
        srv_b.close()
        srv_c.close()


def test_cut_link_refuses_until_restored(topo):
    link = topo.link("a", "b")
    srv = _listen(topo["b"])
    try:
        link.down()
        assert not link.is_up()
        t0 = time.monotonic()
        assert _connect(topo["a"], topo["b"], timeout=1.0) != "ok"
        assert time.monotonic() - t0 < 2.0
        assert _connect(topo["c"], topo["b"]) == "ok"  # the other link is untouched
        link.up()
        assert link.is_up()
        assert _connect(topo["a"], topo["b"]) == "ok"
    finally:
        link.up()
        srv.close()


def test_rate_limited_link_keeps_its_rate(topo):
    link = topo.link("a", "b")
    payload = 4 << 20  # 4 MiB at 100 Mbit/s: ~0.34 s; unlimited veth: a few ms
    srv = _listen(topo["b"])
    received = []

    def drain():
        conn, _ = srv.accept()
        with conn:
            n = 0
            while chunk := conn.recv(1 << 16):
                n += len(chunk)
            received.append(n)

    def send() -> float:
        reader = threading.Thread(target=drain)
        reader.start()
        with inside(topo["a"]):
            conn = socket.create_connection((topo["b"].address, PORT), timeout=5)
        t0 = time.monotonic()
        with conn:
            conn.sendall(b"\0" * payload)
        reader.join(timeout=30)
        assert not reader.is_alive()
        return time.monotonic() - t0

    try:
        free = send()
        link.limit("100mbit")
        limited = send()
        link.limit(None)
        print(f"4 MiB over a-b: {free * 1e3:.1f} ms unlimited, {limited * 1e3:.1f} ms at 100 Mbit/s")
        assert received == [payload, payload]
        assert limited > 0.25  # >= ~75% of the wire time: the bucket holds the rate (plus a 10 ms burst)
        assert free < limited  # (unlimited takes a few ms idle; a loaded CI machine may stretch it)
    finally:
        link.limit(None)
        srv.close()


PROBE_PORT = PORT + 1  # a listener nobody accepts on: the kernel completes each probe's handshake (backlog 128)


def _round_trip_s(src, dst) -> float:
    return src.round_trip_s(dst.address, PROBE_PORT)


def test_delayed_link_adds_its_round_trip_carries_data_and_is_removed(topo):
    link = topo.link("a", "b")
    srv = _listen(topo["b"])
    with inside(topo["b"]):
        probes = socket.create_server((topo["b"].address, PROBE_PORT))
    accepted = []

    def accept(n: int) -> None:
        for _ in range(n):
            conn, _ = srv.accept()
            with conn:
                data = b""
                while chunk := conn.recv(1 << 16):
                    data += chunk
                accepted.append(data)

    try:
        assert _round_trip_s(topo["a"], topo["b"]) < 0.002
        link.delay(0.0025)  # each way
        assert sorted(topo["a"].interfaces()) == ["dl-b", "lo", "to-b"]
        assert _round_trip_s(topo["a"], topo["b"]) >= 0.005
        reader = threading.Thread(target=accept, args=(1,))
        reader.start()
        payload = bytes(range(256)) * 4096  # 1 MiB, in order and whole through the delay line
        with inside(topo["a"]):
            conn = socket.create_connection((topo["b"].address, PORT), timeout=5)
        with conn:
            conn.sendall(payload)
        reader.join(timeout=30)
        assert accepted == [payload]
        assert _connect(topo["c"], topo["b"]) == "ok" and _round_trip_s(topo["c"], topo["b"]) < 0.005  # not b-c
        link.down()  # a cut delayed link refuses like any other, and comes back delayed
        assert _connect(topo["a"], topo["b"], timeout=1.0) != "ok"
        link.up()
        assert _round_trip_s(topo["a"], topo["b"]) >= 0.005
    finally:
        link.up()
        link.delay(None)
    try:
        assert sorted(topo["a"].interfaces()) == ["lo", "to-b"]  # the delay line's device went with it
        assert _round_trip_s(topo["a"], topo["b"]) < 0.002
    finally:
        srv.close()
        probes.close()
