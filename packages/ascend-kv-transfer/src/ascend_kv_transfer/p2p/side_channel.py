"""The ZMQ side channel: a ROUTER server thread on each prefill worker, short REQ round trips from decode workers.

Every wait is bounded: the server polls with a timeout so it can stop, and a client round trip gives up after
`timeout_s` (the socket is then dropped, since a REQ socket that missed its reply cannot be reused).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import zmq

from ascend_kv_transfer.p2p import schema

logger = logging.getLogger(__name__)


class SideChannelTimeout(TimeoutError):
    pass


class SideChannelServer:
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
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"ascend-kv-side-channel-{port}", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(100):
                continue
            identity, _empty, data = self._sock.recv_multipart()
            try:
                reply = self._handler(schema.decode(data))
            except Exception as e:  # a bad request must not kill the server; the peer gets the reason
                logger.warning("side channel request failed: %s", e)
                reply = schema.ErrorResponse(error=str(e))
            self._sock.send_multipart([identity, b"", schema.encode(reply)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
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
