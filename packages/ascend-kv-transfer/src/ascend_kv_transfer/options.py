"""Typed, validated options read from `kv_transfer_config.kv_connector_extra_config`.

Every connector of this package takes its options from that one dict. Unknown keys and bad values are errors that
name the key, because a silently ignored typo (say `abort_timout_s`) is how disaggregated setups end up serving
garbage or hanging. The keys are documented in the package README.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ascend_kv_transfer.p2p.side_channel_auth import SecretError, SideChannelAuth, read_secret

# Mooncake's TCP transport queues at most this many transfers per peer by default
# (MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER); a batch over it fails and poisons the peer.
MOONCAKE_PEER_QUEUE_LIMIT = 1024


class OptionError(ValueError):
    """A `kv_connector_extra_config` key is unknown or has a bad value; the message names the key."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MooncakeOptions:
    """Options of the P2P and layerwise Mooncake connectors."""

    # Address this engine's side channel binds to and advertises to decode engines.
    side_channel_host: str = "127.0.0.1"
    # Base port; each worker adds its rank offset (see p2p.ports).
    side_channel_port: int = 30300
    protocol: str = "tcp"
    device_name: str = ""
    # Prefill frees blocks no decode engine claimed (or finished pulling) after this many seconds.
    abort_timeout_s: float = 120.0
    # Bound on one side-channel round trip (handshake, claim, done).
    handshake_timeout_s: float = 5.0
    # How long a decode keeps asking a prefill that has not yet seen the transfer before giving up.
    claim_wait_s: float = 10.0
    # Pulls up to this many bytes are waited for (up to step_driver.INLINE_READ_WAIT_S) within the engine step that
    # sees the claim answered, so they land in that step; larger ones go to the background thread without a wait, so
    # they do not stall the running batch. 0: never wait.
    inline_read_max_bytes: int = 8 << 20
    # Entries per Mooncake batch call; must stay under the peer's queue limit.
    max_batch_entries: int = 1000
    peer_queue_limit: int = MOONCAKE_PEER_QUEUE_LIMIT
    # After a failed Mooncake transfer its peer is not tried for this long (transfers to it fail fast and recompute);
    # then one transfer probes it, so a link that was cut and came back is used again (p2p.broken_peers).
    broken_peer_retry_s: float = 5.0
    # A file holding the secret every engine (and the router) of this deployment shares: the side channel then
    # answers only requests sealed with it (p2p.side_channel_auth). Empty: anyone reaching the port is answered.
    side_channel_secret_file: str = ""

    def __post_init__(self) -> None:
        _check_port("side_channel_port", self.side_channel_port)
        if self.side_channel_secret_file:
            try:
                read_secret(self.side_channel_secret_file)
            except SecretError as e:
                raise OptionError(f"kv_connector_extra_config['side_channel_secret_file']: {e}") from e
        if self.protocol not in ("tcp", "rdma", "ascend", "hccs"):
            raise OptionError(f"kv_connector_extra_config['protocol']={self.protocol!r}: "
                              "expected one of 'tcp', 'rdma', 'ascend', 'hccs'")
        for key in ("abort_timeout_s", "handshake_timeout_s", "claim_wait_s", "broken_peer_retry_s"):
            if not getattr(self, key) > 0:
                raise OptionError(f"kv_connector_extra_config[{key!r}]={getattr(self, key)!r}: must be > 0")
        if self.inline_read_max_bytes < 0:
            raise OptionError(f"kv_connector_extra_config['inline_read_max_bytes']={self.inline_read_max_bytes!r}: "
                              "must be >= 0")
        if self.peer_queue_limit < 1:
            raise OptionError(f"kv_connector_extra_config['peer_queue_limit']={self.peer_queue_limit!r}: must be >= 1")
        if not 1 <= self.max_batch_entries <= self.peer_queue_limit:
            raise OptionError(
                f"kv_connector_extra_config['max_batch_entries']={self.max_batch_entries!r}: must be between 1 and "
                f"peer_queue_limit={self.peer_queue_limit} (a larger batch fails and breaks the peer)")

    def side_channel_auth(self) -> SideChannelAuth | None:
        """The side channel's sealer/opener, or None when no secret file is configured."""
        return SideChannelAuth.from_file(self.side_channel_secret_file) if self.side_channel_secret_file else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class OffloadOptions:
    """Options of the host-memory offloading connector."""

    # Byte budget of the host tier; least recently used blocks are evicted past it.
    host_bytes: int = 256 << 20

    def __post_init__(self) -> None:
        if self.host_bytes <= 0:
            raise OptionError(f"kv_connector_extra_config['host_bytes']={self.host_bytes!r}: must be > 0")


def _check_port(key: str, port: int) -> None:
    if not 1 <= port <= 65535:
        raise OptionError(f"kv_connector_extra_config[{key!r}]={port!r}: not a TCP port")


def parse_options(cls: type, extra: Mapping[str, Any] | None, *, ignore: tuple[str, ...] = ()):
    """Build `cls` from `extra`, rejecting unknown keys and values of the wrong type by name.

    `ignore` lists keys other parts of vLLM read from the same dict (they are not ours to validate).
    """
    extra = dict(extra or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in extra.items():
        if key in ignore:
            continue
        if key not in fields:
            raise OptionError(f"kv_connector_extra_config has unknown key {key!r}; known keys: {sorted(fields)}")
        kwargs[key] = _coerce(key, value, type(fields[key].default))
    return cls(**kwargs)


def _coerce(key: str, value: Any, kind: type) -> Any:
    if kind is bool or isinstance(value, bool):
        if isinstance(value, bool) and kind is bool:
            return value
        raise OptionError(f"kv_connector_extra_config[{key!r}]={value!r}: expected {kind.__name__}")
    if kind is float and isinstance(value, int | float):
        return float(value)
    if kind is int and isinstance(value, int):
        return value
    if kind is str and isinstance(value, str):
        return value
    raise OptionError(f"kv_connector_extra_config[{key!r}]={value!r}: expected {kind.__name__}")
