"""Typed options of `AscendStoreConnector`, read from `kv_transfer_config.kv_connector_extra_config`.

Sizes are bytes, given as an int or a string with a unit (`"64MiB"`, `"1GB"`, `"512 KiB"`). Every bad key or value is
an `OptionError` naming the key; the keys are documented in the package README (KV pool section).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from ascend_kv_transfer.options import MOONCAKE_PEER_QUEUE_LIMIT, OptionError, parse_options

# Mooncake refuses to mount a segment below this size (`setup` returns -600, "Total size must be at least 16777216").
MIN_SEGMENT_BYTES = 16 << 20

_SIZE_KEYS = ("global_segment_size", "local_buffer_size")
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_METADATA_SCHEMES = ("http://", "https://", "etcd://", "redis://")


@dataclasses.dataclass(frozen=True, kw_only=True)
class StoreOptions:
    """Options of the KV pool connector."""

    # host:port of `mooncake_master`'s RPC service (its `--rpc_port`).
    master_server_address: str = "127.0.0.1:50051"
    # "P2PHANDSHAKE" (no metadata service), or the URL of one, e.g. the master's own HTTP metadata server
    # (`--enable_http_metadata_server`): "http://127.0.0.1:8080/metadata".
    metadata_server: str = "P2PHANDSHAKE"
    protocol: str = "tcp"
    device_name: str = ""
    # Address this worker's store client advertises to its peers; must be reachable by every engine in the pool.
    local_hostname: str = "127.0.0.1"
    # Host memory each worker lends to the pool (0: none). The pool's capacity is the sum over all its clients.
    global_segment_size: int = 1 << 30
    # Mooncake's staging buffer for copies from unregistered memory; the KV pool moves registered KV memory only.
    local_buffer_size: int = 0
    # How long start-up keeps trying to reach the master before failing with an error naming the address.
    master_connect_timeout_s: float = 5.0
    # Transfers (keys x buffers per key) per Mooncake batch call; under the transport's per-peer queue.
    max_batch_transfers: int = 1000
    # Loads up to this size run in the engine step that starts them (no thread hand-off); larger ones on a thread.
    inline_load_max_bytes: int = 8 << 20
    # Also save full blocks of generated tokens (multi-turn reuse), not only the prompt's.
    save_output_blocks: bool = False
    # Name of the model in the pool's keys (default: the model as vLLM names it); engines share blocks only when
    # this, the KV geometry and the parallel layout agree.
    model_key: str = ""
    # Seconds a preempted request's in-flight saves may delay the step that reuses its blocks.
    save_wait_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        host, _, port = self.master_server_address.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise OptionError(f"kv_connector_extra_config['master_server_address']={self.master_server_address!r}: "
                              "expected 'host:port' of mooncake_master's RPC service")
        if self.metadata_server != "P2PHANDSHAKE" and not self.metadata_server.startswith(_METADATA_SCHEMES):
            raise OptionError(f"kv_connector_extra_config['metadata_server']={self.metadata_server!r}: expected "
                              "'P2PHANDSHAKE' or a URL starting with " + ", ".join(_METADATA_SCHEMES))
        if self.protocol not in ("tcp", "rdma", "ascend"):
            raise OptionError(f"kv_connector_extra_config['protocol']={self.protocol!r}: "
                              "expected one of 'tcp', 'rdma', 'ascend'")
        if not self.local_hostname:
            raise OptionError("kv_connector_extra_config['local_hostname'] is empty")
        if self.global_segment_size != 0 and self.global_segment_size < MIN_SEGMENT_BYTES:
            raise OptionError(f"kv_connector_extra_config['global_segment_size']={self.global_segment_size!r}: "
                              f"Mooncake mounts segments of at least {MIN_SEGMENT_BYTES} bytes (16 MiB); "
                              "use 0 to lend no memory")
        for key in ("local_buffer_size", "inline_load_max_bytes"):
            if getattr(self, key) < 0:
                raise OptionError(f"kv_connector_extra_config[{key!r}]={getattr(self, key)!r}: must be >= 0")
        for key in ("master_connect_timeout_s", "save_wait_timeout_s"):
            if not getattr(self, key) > 0:
                raise OptionError(f"kv_connector_extra_config[{key!r}]={getattr(self, key)!r}: must be > 0")
        if not 1 <= self.max_batch_transfers <= MOONCAKE_PEER_QUEUE_LIMIT:
            raise OptionError(
                f"kv_connector_extra_config['max_batch_transfers']={self.max_batch_transfers!r}: must be between 1 "
                f"and {MOONCAKE_PEER_QUEUE_LIMIT} (Mooncake's per-peer queue; a fuller batch fails)")

    @property
    def master_host_port(self) -> tuple[str, int]:
        host, _, port = self.master_server_address.rpartition(":")
        return host.strip("[]"), int(port)


def parse_size(key: str, value: Any) -> int:
    """Bytes from an int or a string such as "64MiB" / "1GB" / "1.5 GiB" (units are powers of 1024)."""
    if isinstance(value, bool):
        raise OptionError(f"kv_connector_extra_config[{key!r}]={value!r}: expected a size in bytes")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            return int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    raise OptionError(f"kv_connector_extra_config[{key!r}]={value!r}: expected a size in bytes, as an int or a "
                      "string such as '64MiB' or '1GB'")


def parse_store_options(extra: Mapping[str, Any] | None) -> StoreOptions:
    extra = dict(extra or {})
    for key in _SIZE_KEYS:
        if key in extra:
            extra[key] = parse_size(key, extra[key])
    return parse_options(StoreOptions, extra)
