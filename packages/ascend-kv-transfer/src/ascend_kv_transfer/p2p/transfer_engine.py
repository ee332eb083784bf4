"""A thin owner of one Mooncake `TransferEngine`: lazy import, one registration per span (re-registered when the KV
memory moves), chunked batch transfers.

A batch that fails marks its peer broken for a cool-down (`p2p.broken_peers`): right after a failure (Mooncake's TCP
transport rejects a peer's over-full queue; a cut link stalls until its progress timeout) a blind retry would fail
too, so callers get `BrokenPeerError` at once; once the cool-down ends one transfer probes the peer, so a link that
came back is used again.
"""

from __future__ import annotations

import logging
import time

from ascend_kv_transfer.kv_regions import Storage
from ascend_kv_transfer.p2p.broken_peers import BrokenPeerError, BrokenPeers
from ascend_kv_transfer.p2p.plan import Entries, chunk

logger = logging.getLogger(__name__)


class MooncakeUnavailableError(ImportError):
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
    def __init__(self, host: str, protocol: str = "tcp", device_name: str = "", *, max_batch_entries: int = 1000,
                 broken_peer_retry_s: float = 5.0):
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
        self.broken = BrokenPeers(broken_peer_retry_s)

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
        return self.broken.reason(peer)

    def read(self, peer: str, entries: Entries) -> int:
        """Pull `entries` from `peer` in batches under the queue limit; returns the number of batch calls."""
        return self._transfer(peer, entries, self.engine.batch_transfer_sync_read)

    def write(self, peer: str, entries: Entries) -> int:
        return self._transfer(peer, entries, self.engine.batch_transfer_sync_write)

    def _transfer(self, peer: str, entries: Entries, op) -> int:
        probe = self.broken.admit(peer)
        calls = 0
        try:
            for batch in chunk(entries, self.max_batch_entries):
                ret = op(peer, batch.local, batch.remote, batch.lengths)
                calls += 1
                if ret < 0:
                    why = f"batch of {len(batch)} entries ({batch.nbytes} B) returned {ret} at {time.strftime('%X')}"
                    retry_s = self.broken.failed(peer, why)
                    logger.error("Mooncake peer %s marked broken%s: %s; next try in %.1f s", peer,
                                 " again (probe failed)" if probe else "", why, retry_s)
                    raise BrokenPeerError(f"Mooncake transfer with peer {peer} failed: {why}; "
                                          f"not retrying for {retry_s:.1f} s")
        except BrokenPeerError:
            raise
        except BaseException as e:  # the op itself raised: a probe must not leave the peer stuck in "probing"
            if probe:
                self.broken.failed(peer, f"probe transfer raised {e!r}")
            raise
        if self.broken.succeeded(peer):
            logger.warning("Mooncake peer %s is reachable again (a transfer of %d entries went through)",
                           peer, len(entries))
        return calls

    def close(self) -> None:
        if self._registered:
            try:
                self.engine.batch_unregister_memory([s.addr for s in self._registered])
            except Exception:  # shutting down: the process is going away with the memory anyway
                logger.debug("unregistering Mooncake memory failed", exc_info=True)
            self._registered = []
