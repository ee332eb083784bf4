"""The router's settings: upstream servers per role, bind address, timeouts, health checks and queue bounds.

Every value is checked when the config is built; a bad one is an error that names the option and the value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from urllib.parse import urlsplit


class RouterConfigError(ValueError):
    pass


def normalize_url(option: str, url: str) -> str:
    """`http://host:port` (no trailing slash, no path): the base the OpenAI routes are appended to."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise RouterConfigError(f"{option} {url!r}: expected http://HOST:PORT")
    try:
        port = parts.port
    except ValueError as exc:
        raise RouterConfigError(f"{option} {url!r}: bad port ({exc})") from exc
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise RouterConfigError(f"{option} {url!r}: give the server's base URL, without a path such as /v1")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{parts.scheme}://{host}" + (f":{port}" if port is not None else "")


@dataclass(frozen=True)
class RouterConfig:
    prefill: tuple[str, ...]
    decode: tuple[str, ...]
    host: str = "127.0.0.1"
    port: int = 8000
    # Bounds on every upstream call (seconds).
    connect_timeout_s: float = 5.0
    prefill_timeout_s: float = 300.0  # the whole prefill request
    decode_timeout_s: float = 1800.0  # the whole decode response, streamed or not
    read_timeout_s: float = 300.0  # the longest wait for the next bytes of a decode response
    # Health checks of every upstream (GET /health).
    health_interval_s: float = 5.0
    health_timeout_s: float = 3.0
    # Admission: requests proxied at once, and how many more may wait (and how long) before a 503.
    max_inflight: int = 256
    max_queued: int = 1024
    queue_timeout_s: float = 60.0
    # Idle upstream connections are dropped before the servers' keep-alive (vLLM: 5 s) closes them under us.
    keepalive_s: float = 3.0
    # When a decode leg fails, the prefill's held KV blocks are released over its side channel, each round trip
    # bounded by this; the secret (a file) is the one the engines' side channels were given, if any.
    release_timeout_s: float = 2.0
    side_channel_secret_file: str = ""

    def __post_init__(self) -> None:
        for role in ("prefill", "decode"):
            urls = tuple(normalize_url(f"--{role}", u) for u in getattr(self, role))
            if not urls:
                raise RouterConfigError(f"at least one --{role} server is needed")
            dupes = sorted({u for u in urls if urls.count(u) > 1})
            if dupes:
                raise RouterConfigError(f"--{role} lists {', '.join(dupes)} more than once")
            object.__setattr__(self, role, urls)
        if not 0 <= self.port <= 65535:
            raise RouterConfigError(f"--port {self.port}: not a TCP port")
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name.endswith("_s") and not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise RouterConfigError(f"{option_name(f.name)} {value!r}: must be a positive number of seconds")
        if self.side_channel_secret_file:
            from ascend_kv_transfer.p2p.side_channel_auth import SecretError, read_secret

            try:
                read_secret(self.side_channel_secret_file)
            except SecretError as exc:
                raise RouterConfigError(f"--side-channel-secret-file: {exc}") from exc
        for name in ("max_inflight", "max_queued"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < (1 if name == "max_inflight" else 0):
                raise RouterConfigError(f"{option_name(name)} {value!r}: must be an integer "
                                        f"{'>= 1' if name == 'max_inflight' else '>= 0'}")


def option_name(field_name: str) -> str:
    """The command-line option of a config field (`read_timeout_s` -> `--read-timeout`)."""
    name = field_name[:-2] if field_name.endswith("_s") else field_name
    return "--" + name.replace("_", "-")
