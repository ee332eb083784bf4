"""The ZMQ side channel: a ROUTER server thread on each prefill worker, short round trips from decode workers.

Every wait is bounded: the server polls with a timeout so it can stop, and a client round trip gives up after
`timeout_s` (the socket is then dropped, since a socket that missed a reply cannot be trusted to pair the next one).
Two clients: `SideChannelClient` blocks for its answer (threads, tools, tests); `AsyncSideChannelClient` never
blocks, for the engine's own thread: `send` returns a `PendingReply` that a later `poll` fills in. A handler may
answer `Deferred`: the server parks the request and asks again on each pass until the handler can answer.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections.abc import Callable

import zmq

from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.side_channel_auth import SideChannelAuth

logger = logging.getLogger(__name__)


class SideChannelTimeout(TimeoutError):
    pass


def _connect(ctx: zmq.Context, kind: int, address: tuple[str, int]) -> zmq.Socket:
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)  # closing must never wait for a peer that is gone
    sock.connect(f"tcp://{address[0]}:{address[1]}")
    return sock


def _sealed(auth: SideChannelAuth | None, message: schema.Message) -> bytes:
    payload = schema.encode(message)
    return payload if auth is None else auth.seal(payload)


class Deferred:
    """A handler's "not yet": the server asks again on each pass for up to `wait_s`, then sends `otherwise`."""

    __slots__ = ("wait_s", "otherwise")

    def __init__(self, wait_s: float, otherwise: schema.Message):
        self.wait_s = wait_s
        self.otherwise = otherwise


class SideChannelServer:
    """Answers requests from a thread, and from the engine's own thread whenever it calls `serve_pending`.

    A thread alone answers late exactly when it matters: an engine holding blocks for a decode steps without pause,
    so the thread waits out Python's 5 ms GIL switch interval (and the core's time slice) for every request. The
    engine's connector calls `serve_pending` each step, which answers what has arrived at once; the thread covers an
    idle engine. One lock owns the socket (ZMQ sockets may change threads, never be used by two at once); the
    thread waits on the socket's file descriptor without holding it.
    """

    def __init__(self, host: str, port: int, handler: Callable[[schema.AnyMessage], schema.Message | Deferred], *,
                 auth: SideChannelAuth | None = None):
        self._auth = auth
        self._ctx = zmq.Context.instance()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        try:
            self._sock.bind(f"tcp://{host}:{port}")
        except zmq.ZMQError as e:
            self._sock.close()
            raise OSError(f"side channel cannot bind tcp://{host}:{port}: {e}") from e
        self.address = (host, port)
        self._handler = handler
        self._lock = threading.Lock()
        self._fd = self._sock.getsockopt(zmq.FD)
        # Requests whose handler deferred the answer: (envelope frames, message, arrival time), asked again each pass.
        self._parked: list[tuple[list[bytes], schema.AnyMessage, float]] = []
        self.answered_by_engine = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"ascend-kv-side-channel-{port}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            # The fd is edge-triggered: readable once something changed; draining to EAGAIN re-arms it. The
            # timeout covers an edge the engine's thread consumed.
            select.select([self._fd], [], [], 0.005 if self._parked else 0.05)
            with self._lock:
                if not self._stop.is_set():
                    self._drain()

    def serve_pending(self) -> int:
        """Answer every request that has arrived (skipped while the thread is at it); returns how many."""
        if not self._lock.acquire(blocking=False):
            return 0
        try:
            answered = self._drain() if not self._stop.is_set() else 0
        finally:
            self._lock.release()
        self.answered_by_engine += answered
        return answered

    def _drain(self) -> int:
        answered = self._retry_parked()
        while True:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return answered
            envelope = frames[:-1]  # identity, delimiter (and a DEALER's request id): echoed with the answer
            payload = frames[-1] if self._auth is None else self._auth.open(frames[-1])
            if payload is None:  # not from a peer holding the secret: no answer at all (counted in `refused`)
                self._warn_refused()
                continue
            try:
                message = schema.decode(payload)
            except Exception as e:
                self._reply(envelope, schema.ErrorResponse(error=str(e)))
                answered += 1
                continue
            if self._answer(envelope, message, time.monotonic()):
                answered += 1

    @property
    def refused(self) -> dict[str, int]:
        """Requests left unanswered because they were not sealed with the secret, by reason."""
        return {} if self._auth is None else dict(self._auth.refused)

    def _warn_refused(self) -> None:
        if sum(self._auth.refused.values()) == 1:
            logger.warning("side channel tcp://%s:%d: refused a request not sealed with the shared secret (%s); "
                           "further refusals are only counted", *self.address, ", ".join(self._auth.refused))

    def _answer(self, envelope: list[bytes], message: schema.AnyMessage, since: float) -> bool:
        """Answer now, or park the request if the handler defers it (False)."""
        try:
            reply = self._handler(message)
        except Exception as e:  # a bad request must not kill the server; the peer gets the reason
            logger.warning("side channel request failed: %s", e)
            reply = schema.ErrorResponse(error=str(e))
        if isinstance(reply, Deferred):
            if time.monotonic() - since < reply.wait_s:
                self._parked.append((envelope, message, since))
                return False
            reply = reply.otherwise
        self._reply(envelope, reply)
        return True

    def _retry_parked(self) -> int:
        parked, self._parked = self._parked, []
        return sum(self._answer(envelope, message, since) for envelope, message, since in parked)

    def _reply(self, envelope: list[bytes], reply: schema.Message) -> None:
        self._sock.send_multipart([*envelope, schema.encode(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self._lock:
            self._sock.close()


class SideChannelClient:
    """Round trips to peers, one cached REQ socket per peer address (use from one thread)."""

    def __init__(self, timeout_s: float, *, auth: SideChannelAuth | None = None):
        self._auth = auth
        self._ctx = zmq.Context.instance()
        self._timeout_ms = int(timeout_s * 1000)
        self._socks: dict[tuple[str, int], zmq.Socket] = {}

    def request(self, address: tuple[str, int], message: schema.Message) -> schema.AnyMessage:
        sock = self._socks.get(address)
        if sock is None:
            sock = self._socks[address] = _connect(self._ctx, zmq.REQ, address)
        try:
            sock.send(_sealed(self._auth, message))
            if not sock.poll(self._timeout_ms, zmq.POLLIN):
                raise SideChannelTimeout(f"no answer from side channel tcp://{address[0]}:{address[1]} within "
                                         f"{self._timeout_ms / 1000:g} s")
            reply = schema.decode(sock.recv())
        except BaseException:
            self._drop(address)
            raise
        if isinstance(reply, schema.ErrorResponse):
            raise RuntimeError(f"peer tcp://{address[0]}:{address[1]} refused {type(message).__name__}: {reply.error}")
        return reply

    def _drop(self, address: tuple[str, int]) -> None:
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for address in list(self._socks):
            self._drop(address)


class PendingReply:
    """The answer to one `AsyncSideChannelClient.send`: `reply` or `error` once `done`."""

    __slots__ = ("message", "sent_at", "reply", "error")

    def __init__(self, message: schema.Message):
        self.message = message
        self.sent_at = time.monotonic()
        self.reply: schema.AnyMessage | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.reply is not None or self.error is not None


class AsyncSideChannelClient:
    """Round trips that never block the caller (use from one thread).

    One DEALER socket per peer; each request carries an id the server echoes, since a server may answer a later
    request first (it parks requests it cannot answer yet). A request unanswered for `timeout_s` fails; a late
    answer to it is dropped.
    """

    def __init__(self, timeout_s: float, *, auth: SideChannelAuth | None = None):
        self._auth = auth
        self._ctx = zmq.Context.instance()
        self._timeout_s = timeout_s
        self._socks: dict[tuple[str, int], zmq.Socket] = {}
        self._inflight: dict[tuple[str, int], dict[bytes, PendingReply]] = {}
        self._next_id = 0

    def send(self, address: tuple[str, int], message: schema.Message) -> PendingReply:
        pending = PendingReply(message)
        sock = self._socks.get(address)
        if sock is None:
            sock = self._socks[address] = _connect(self._ctx, zmq.DEALER, address)
            self._inflight[address] = {}
        self._next_id += 1
        rid = self._next_id.to_bytes(8, "little")
        try:
            sock.send_multipart([b"", rid, _sealed(self._auth, message)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the queue to a peer that never answers is full
            pending.error = SideChannelTimeout(f"cannot send {type(message).__name__} to tcp://{address[0]}:"
                                               f"{address[1]}: {e}")
            return pending
        self._inflight[address][rid] = pending
        return pending

    def in_flight(self) -> int:
        return sum(len(q) for q in self._inflight.values())

    def wait(self, timeout_s: float) -> None:
        """Sleep until an answer may have arrived on any socket, at most `timeout_s` (for blocking callers)."""
        if timeout_s <= 0:
            return
        if not self._socks:
            time.sleep(timeout_s)
            return
        poller = zmq.Poller()
        for sock in self._socks.values():
            poller.register(sock, zmq.POLLIN)
        poller.poll(timeout_s * 1000)

    def poll(self) -> None:
        """Take every answer that has arrived; fail what waited past the timeout."""
        now = time.monotonic()
        for address, sock in self._socks.items():
            inflight = self._inflight[address]
            while inflight:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                pending = inflight.pop(frames[-2], None) if len(frames) >= 2 else None
                if pending is None:
                    continue  # the answer to a request that already timed out
                try:
                    reply = schema.decode(frames[-1])
                except Exception as e:
                    pending.error = e
                    continue
                if isinstance(reply, schema.ErrorResponse):
                    pending.error = RuntimeError(f"peer tcp://{address[0]}:{address[1]} refused "
                                                 f"{type(pending.message).__name__}: {reply.error}")
                else:
                    pending.reply = reply
            for rid, pending in list(inflight.items()):
                if now - pending.sent_at > self._timeout_s:
                    pending.error = SideChannelTimeout(f"no answer to {type(pending.message).__name__} from side "
                                                       f"channel tcp://{address[0]}:{address[1]} within "
                                                       f"{self._timeout_s:g} s")
                    del inflight[rid]

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()
        self._inflight.clear()
