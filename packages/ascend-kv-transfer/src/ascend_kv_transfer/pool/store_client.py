"""One owner of a `MooncakeDistributedStore` client: a bounded start-up, chunked batch calls, and the pool switch.

Start-up first checks that the master accepts TCP connections (Mooncake's own `setup` waits about 90 s against an
absent master, then returns -1 without saying why) and fails with `PoolUnavailableError` naming the address and
what was tried. At run time the calls return per-key status codes, never raise for a missing key; a code saying the
master cannot be reached (RPC failure or timeout) turns the pool off for this client with one warning: lookups then
miss, saves are skipped, loads fail over to recompute, and serving goes on. An exception from the binding fails that
call only (the caller reports it as a load error or an uncached save).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Sequence

from ascend_kv_transfer.kv_regions import Storage
from ascend_kv_transfer.pool.options import StoreOptions

logger = logging.getLogger(__name__)

# Mooncake's ErrorCode values (mooncake-store/include/types.h) the pool tells apart.
NO_AVAILABLE_HANDLE = -200
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
LEASE_EXPIRED = -707
TRANSFER_FAIL = -800
RPC_FAIL = -900
RPC_TIMEOUT = -901
CODE_NAMES = {
    -1: "INTERNAL_ERROR", NO_AVAILABLE_HANDLE: "NO_AVAILABLE_HANDLE (pool full)", INVALID_PARAMS: "INVALID_PARAMS",
    -703: "REPLICA_IS_NOT_READY", OBJECT_NOT_FOUND: "OBJECT_NOT_FOUND", OBJECT_ALREADY_EXISTS: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE", LEASE_EXPIRED: "LEASE_EXPIRED", TRANSFER_FAIL: "TRANSFER_FAIL (size mismatch or I/O)",
    RPC_FAIL: "RPC_FAIL (master unreachable)", RPC_TIMEOUT: "RPC_TIMEOUT",
}
# Codes after which this client cannot talk to the master any more.
MASTER_LOST = frozenset({RPC_FAIL, RPC_TIMEOUT})


class MooncakeStoreUnavailableError(ImportError):
    pass


class PoolUnavailableError(RuntimeError):
    """The pool cannot start: the master is unreachable or Mooncake refused the client (message says which)."""


def code_name(code: int) -> str:
    return f"{code} {CODE_NAMES.get(code, 'UNKNOWN')}"


def load_store_cls() -> type:
    try:
        from mooncake.store import MooncakeDistributedStore
    except ImportError as e:
        raise MooncakeStoreUnavailableError(
            "Mooncake's store client is not importable; install it with `pip install \"ascend-kv-transfer[mooncake]\"` "
            f"(or `[mooncake-npu]` on Ascend hosts) ({e})") from e
    return MooncakeDistributedStore


def probe_master(host: str, port: int, timeout_s: float) -> None:
    """Wait until `host:port` accepts a TCP connection, at most `timeout_s`; else raise naming what was tried."""
    deadline = time.monotonic() + timeout_s
    attempts, last = 0, ""
    while True:
        attempts += 1
        try:
            with socket.create_connection((host, port), timeout=min(1.0, timeout_s)):
                return
        except OSError as e:
            last = f"{type(e).__name__}: {e}"
        if time.monotonic() + 0.2 > deadline:
            break
        time.sleep(0.2)
    raise PoolUnavailableError(
        f"Mooncake master at {host}:{port} is unreachable: {attempts} TCP connection attempts over {timeout_s:g} s "
        f"failed (last: {last}). Start it (`mooncake_master --rpc_port={port}`) or set "
        "kv_connector_extra_config['master_server_address'] to where it listens.")


def _chunks(n: int, per_item: int, max_transfers: int) -> list[slice]:
    step = max(1, max_transfers // max(1, per_item))
    return [slice(i, min(n, i + step)) for i in range(0, n, step)]


class StoreClient:
    """A store client for one role. `contribute=False` (the scheduler's) lends no memory and moves no data."""

    def __init__(self, options: StoreOptions, *, contribute: bool, name: str):
        self.options = options
        self.name = name
        host, port = options.master_host_port
        probe_master(host, port, options.master_connect_timeout_s)
        store = load_store_cls()()
        segment = options.global_segment_size if contribute else 0
        buffer = options.local_buffer_size if contribute else 0
        # A client that moves no data needs no device transport; TCP works against any pool.
        protocol = options.protocol if contribute else "tcp"
        ret = store.setup(options.local_hostname, options.metadata_server, segment, buffer, protocol,
                          options.device_name if contribute else "", options.master_server_address)
        if ret != 0:
            raise PoolUnavailableError(
                f"MooncakeDistributedStore.setup(local_hostname={options.local_hostname!r}, metadata_server="
                f"{options.metadata_server!r}, global_segment_size={segment}, local_buffer_size={buffer}, protocol="
                f"{protocol!r}, master_server_addr={options.master_server_address!r}) returned {code_name(ret)}; "
                "Mooncake's log above says why (segment size, metadata server, protocol/device)")
        self.store = store
        self.available = True
        self.disabled_reason = ""
        self._registered: list[int] = []
        self._lock = threading.Lock()
        logger.info("KV pool %s client connected to master %s (segment %d B, protocol %s)", name,
                    options.master_server_address, segment, protocol)

    # ---- pool switch --------------------------------------------------------------------------------------------
    def disable(self, reason: str) -> None:
        with self._lock:
            if not self.available:
                return
            self.available = False
            self.disabled_reason = reason
        logger.warning("KV pool turned off for this %s: %s; serving continues without the pool", self.name, reason)

    def _note_codes(self, op: str, keys: Sequence[str], codes: Sequence[int]) -> None:
        for key, code in zip(keys, codes, strict=False):
            if code in MASTER_LOST:
                self.disable(f"{op} of {key!r} returned {code_name(code)} (master "
                             f"{self.options.master_server_address})")
                return

    def _call(self, op: str, keys: Sequence[str], fn, *args) -> list[int]:
        try:
            codes = list(fn(*args))
        except Exception as e:
            # Counted and reported by the caller (a load error, an uncached save); the pool stays on, because only
            # the master's reachability says whether later calls can work.
            logger.warning("KV pool %s: %s of %d keys (first %r) raised %s: %s", self.name, op, len(keys), keys[0],
                           type(e).__name__, e)
            raise
        if len(codes) != len(keys):
            self.disable(f"{op} returned {len(codes)} codes for {len(keys)} keys")
            return [-1] * len(keys)
        self._note_codes(op, keys, codes)
        return codes

    # ---- calls --------------------------------------------------------------------------------------------------
    def register(self, storages: Sequence[Storage]) -> None:
        for s in storages:
            if s.addr in self._registered:
                continue
            ret = self.store.register_buffer(s.addr, s.nbytes)
            if ret != 0:
                raise RuntimeError(f"Mooncake register_buffer(0x{s.addr:x}, {s.nbytes}) returned {code_name(ret)}")
            self._registered.append(s.addr)

    def exists(self, keys: Sequence[str]) -> list[int]:
        """1 present, 0 absent, negative on error, per key; all 0 while the pool is off."""
        if not self.available or not keys:
            return [0] * len(keys)
        try:
            return self._call("batch_is_exist", keys, self.store.batch_is_exist, list(keys))
        except Exception:
            return [0] * len(keys)

    def get(self, keys: Sequence[str], ptrs: Sequence[list[int]], sizes: Sequence[list[int]]) -> list[int]:
        """Bytes read per key or a negative code; raises what the binding raises (the caller reports the load)."""
        return self._batched("batch_get_into_multi_buffers", keys, ptrs, sizes, self.store.batch_get_into_multi_buffers)

    def put(self, keys: Sequence[str], ptrs: Sequence[list[int]], sizes: Sequence[list[int]]) -> list[int]:
        from mooncake.store import ReplicateConfig

        config = ReplicateConfig()
        return self._batched("batch_put_from_multi_buffers", keys, ptrs, sizes,
                             lambda k, p, s: self.store.batch_put_from_multi_buffers(k, p, s, config))

    def remove(self, keys: Sequence[str]) -> None:
        for key in keys:
            self.store.remove(key, True)

    def _batched(self, op: str, keys, ptrs, sizes, fn) -> list[int]:
        if not keys:
            return []
        if not self.available:
            return [RPC_FAIL] * len(keys)
        codes: list[int] = []
        for part in _chunks(len(keys), max(len(p) for p in ptrs), self.options.max_batch_transfers):
            if not self.available:
                codes += [RPC_FAIL] * (part.stop - part.start)
                continue
            codes += self._call(op, keys[part], fn, list(keys[part]), list(ptrs[part]), list(sizes[part]))
        return codes

    def close(self) -> None:
        self.available = False
        store, self.store = getattr(self, "store", None), None
        if store is None:
            return
        try:
            for addr in self._registered:
                store.unregister_buffer(addr)
            store.close()
        except Exception:  # shutting down: the memory goes away with the process
            logger.debug("closing the Mooncake store client failed", exc_info=True)
