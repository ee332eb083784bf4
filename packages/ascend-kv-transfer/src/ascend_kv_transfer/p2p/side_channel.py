"""The ZMQ side channel: a ROUTER server thread on each prefill worker, short round trips from decode workers.

Every wait is bounded: the server polls with a timeout so it can stop, and a client round trip gives up after
`timeout_s` (the socket is then dropped, since a socket that missed a reply cannot be trusted to pair the next one).
Two clients: `SideChannelClient` blocks for its answer (threads, tools, tests); `AsyncSideChannelClient` never
blocks, for the engine's own thread: `send` returns a `PendingReply` that a later `poll` fills in.
"""

from __future__ import annotations

import logging
import select
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq

from ascend_kv_transfer.p2p import schema

logger = logging.getLogger(__name__)


class SideChannelTimeout(TimeoutError):
    pass


class SideChannelServer:
    """Answers requests from a thread, and from the engine's own thread whenever it calls `serve_pending`.

    A thread alone answers late exactly when it matters: an engine holding blocks for a decode steps without pause,
    so the thread waits out Python's 5 ms GIL switch interval (and the core's time slice) for every request. The
    engine's connector calls `serve_pending` each step, which answers what has arrived at once; the thread covers an
    idle engine. One lock owns the socket (ZMQ sockets may change threads, never be used by two at once); the
    thread waits on the socket's file descriptor without holding it.
    """

    def __init__(self, host: str, port: int, handler: Callable[[schema.AnyMessage], schema.Message]):
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
        self.answered_by_engine = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"ascend-kv-side-channel-{port}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            # The fd is edge-triggered: readable once something changed; draining to EAGAIN re-arms it. The
            # timeout covers an edge the engine's thread consumed.
            select.select([self._fd], [], [], 0.05)
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
        answered = 0
        while True:
            try:
                frames = self._sock.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return answered
            try:
                reply = self._handler(schema.decode(frames[-1]))
            except Exception as e:  # a bad request must not kill the server; the peer gets the reason
                logger.warning("side channel request failed: %s", e)
                reply = schema.ErrorResponse(error=str(e))
            # Echo the envelope (identity, delimiter) so REQ and DEALER peers both get their answer.
            self._sock.send_multipart([*frames[:-1], schema.encode(reply)])
            answered += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        with self._lock:
            self._sock.close()


class SideChannelClient:
    """Round trips to peers, one cached REQ socket per peer address (use from one thread)."""

    def __init__(self, timeout_s: float):
        self._ctx = zmq.Context.instance()
        self._timeout_ms = int(timeout_s * 1000)
        self._socks: dict[tuple[str, int], zmq.Socket] = {}

    def request(self, address: tuple[str, int], message: schema.Message) -> schema.AnyMessage:
        sock = self._socks.get(address)
        if sock is None:
            sock = self._ctx.socket(zmq.REQ)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{address[0]}:{address[1]}")
            self._socks[address] = sock
        try:
            sock.send(schema.encode(message))
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

    One DEALER socket per peer: the ROUTER server answers each connection's requests in order, so replies are
    matched to requests first in, first out. A peer that leaves its oldest request unanswered for `timeout_s` fails
    every request in flight to it, and its socket is replaced on the next send.
    """

    def __init__(self, timeout_s: float):
        self._ctx = zmq.Context.instance()
        self._timeout_s = timeout_s
        self._socks: dict[tuple[str, int], zmq.Socket] = {}
        self._inflight: dict[tuple[str, int], deque[PendingReply]] = {}

    def send(self, address: tuple[str, int], message: schema.Message) -> PendingReply:
        pending = PendingReply(message)
        sock = self._socks.get(address)
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(f"tcp://{address[0]}:{address[1]}")
            self._socks[address] = sock
            self._inflight[address] = deque()
        try:
            sock.send_multipart([b"", schema.encode(message)], flags=zmq.NOBLOCK)
        except zmq.ZMQError as e:  # the queue to a peer that never answers is full
            pending.error = SideChannelTimeout(f"cannot send {type(message).__name__} to tcp://{address[0]}:"
                                               f"{address[1]}: {e}")
            return pending
        self._inflight[address].append(pending)
        return pending

    def in_flight(self) -> int:
        return sum(len(q) for q in self._inflight.values())

    def poll(self) -> None:
        """Take every reply that has arrived; fail what waited past the timeout."""
        now = time.monotonic()
        for address, sock in list(self._socks.items()):
            queue = self._inflight[address]
            while queue:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK)
                except zmq.Again:
                    break
                pending = queue.popleft()
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
            if queue and now - queue[0].sent_at > self._timeout_s:
                error = SideChannelTimeout(f"no answer from side channel tcp://{address[0]}:{address[1]} within "
                                           f"{self._timeout_s:g} s")
                for pending in queue:
                    pending.error = error
                self._drop(address)

    def _drop(self, address: tuple[str, int]) -> None:
        self._inflight.pop(address, None)
        sock = self._socks.pop(address, None)
        if sock is not None:
            sock.close()

    def close(self) -> None:
        for address in list(self._socks):
            self._drop(address)
