"""A thin owner of one Mooncake `TransferEngine`: lazy import, one registration per span (re-registered when the KV
memory moves), chunked batch transfers.

A batch that fails marks its peer broken: Mooncake's TCP transport poisons the peer after an over-full queue, so
every later transfer would fail too; callers get `BrokenPeerError` at once instead of a blind retry.
"""

from __future__ import annotations

import logging
import threading
import time

from ascend_kv_transfer.kv_regions import Storage
from ascend_kv_transfer.p2p.plan import Entries, chunk

logger = logging.getLogger(__name__)


class MooncakeUnavailableError(ImportError):
    pass


class BrokenPeerError(RuntimeError):
    pass


def load_transfer_engine_cls() -> type:
    try:
        from mooncake.engine import TransferEngine
    except ImportError as e:
        raise MooncakeUnavailableError(
            "Mooncake's transfer engine is not importable; install it with "
            "`pip install \"ascend-kv-transfer[mooncake]\"` (or `[mooncake-npu]` on Ascend hosts)"
            f" ({e})") from e
    return TransferEngine


class TransferEngineHandle:
    def __init__(self, host: str, protocol: str = "tcp", device_name: str = "", *, max_batch_entries: int = 1000):
        cls = load_transfer_engine_cls()
        self.engine = cls()
        ret = self.engine.initialize(host, "P2PHANDSHAKE", protocol, device_name)
        if ret != 0:
            raise RuntimeError(f"Mooncake TransferEngine.initialize({host!r}, P2PHANDSHAKE, {protocol!r}) "
                               f"returned {ret}")
        self.host = host
        self.rpc_port = int(self.engine.get_rpc_port())
        self.max_batch_entries = max_batch_entries
        self._registered: list[Storage] = []
        self._broken: dict[str, str] = {}
        self._lock = threading.Lock()

    @property
    def segment(self) -> str:
        return f"{self.host}:{self.rpc_port}"

    def register(self, storages: list[Storage]) -> None:
        """Make `storages` exactly what is registered: new spans are registered, spans no longer listed (KV memory
        that was freed and re-allocated elsewhere, e.g. after sleep/wake) are unregistered first."""
        wanted = {(s.addr, s.nbytes) for s in storages}
        stale = [s for s in self._registered if (s.addr, s.nbytes) not in wanted]
        if stale:
            ret = self.engine.batch_unregister_memory([s.addr for s in stale])
            if ret != 0:
                raise RuntimeError(f"Mooncake batch_unregister_memory of {len(stale)} stale spans returned {ret}")
            self._registered = [s for s in self._registered if (s.addr, s.nbytes) in wanted]
        known = {(s.addr, s.nbytes) for s in self._registered}
        new = [s for s in storages if (s.addr, s.nbytes) not in known]
        if not new:
            return
        ret = self.engine.batch_register_memory([s.addr for s in new], [s.nbytes for s in new])
        if ret != 0:
            raise RuntimeError(f"Mooncake batch_register_memory of {len(new)} storages "
                               f"({sum(s.nbytes for s in new)} B) returned {ret}")
        self._registered.extend(new)

    @property
    def registered(self) -> list[Storage]:
        return list(self._registered)

    def broken_reason(self, peer: str) -> str | None:
        return self._broken.get(peer)

    def read(self, peer: str, entries: Entries) -> int:
        """Pull `entries` from `peer` in batches under the queue limit; returns the number of batch calls."""
        return self._transfer(peer, entries, self.engine.batch_transfer_sync_read)

    def write(self, peer: str, entries: Entries) -> int:
        return self._transfer(peer, entries, self.engine.batch_transfer_sync_write)

    def _transfer(self, peer: str, entries: Entries, op) -> int:
        reason = self._broken.get(peer)
        if reason is not None:
            raise BrokenPeerError(f"Mooncake peer {peer} is broken ({reason}); not retrying")
        calls = 0
        for batch in chunk(entries, self.max_batch_entries):
            ret = op(peer, batch.local, batch.remote, batch.lengths)
            calls += 1
            if ret < 0:
                why = f"batch of {len(batch)} entries ({batch.nbytes} B) returned {ret} at {time.strftime('%X')}"
                with self._lock:
                    self._broken[peer] = why
                logger.error("Mooncake peer %s marked broken: %s", peer, why)
                raise BrokenPeerError(f"Mooncake transfer with peer {peer} failed: {why}")
        return calls

    def close(self) -> None:
        if self._registered:
            try:
                self.engine.batch_unregister_memory([s.addr for s in self._registered])
            except Exception:  # shutting down: the process is going away with the memory anyway
                logger.debug("unregistering Mooncake memory failed", exc_info=True)
            self._registered = []
