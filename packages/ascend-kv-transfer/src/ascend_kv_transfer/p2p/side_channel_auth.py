"""Who may talk to a prefill's side channel: requests sealed with a secret the operator shares between the engines.

Unauthenticated, the side channel hands every KV region's base address to whoever asks (and Mooncake's transfers
then read any of it) and frees a transfer's blocks for anyone who knows its id. With a secret, every request carries
`MAGIC | nonce | timestamp | HMAC-SHA256(secret, nonce | timestamp | payload) | payload`; the server answers only a
request whose MAC matches, whose timestamp is within `max_age_s` of its clock and whose nonce it has not seen in that
window (a captured request cannot be replayed). Everything else gets no answer and is counted by reason. Answers are
not sealed: the secret keeps strangers from asking, it does not protect the wire (use a private network for that).

The secret comes from a file (`kv_connector_extra_config['side_channel_secret_file']`, the router's
`--side-channel-secret-file`): never from the command line, and never logged.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import os
import struct
import threading
import time
from pathlib import Path

MAGIC = b"ASC1"
_NONCE = 16
_STAMP = struct.Struct(">d")
_MAC = 32
_HEADER = len(MAGIC) + _NONCE + _STAMP.size + _MAC
# Requests within this many seconds of the server's clock are accepted (hosts are expected to run NTP).
MAX_AGE_S = 30.0
_MIN_SECRET_BYTES = 16


class SecretError(ValueError):
    """The secret file is missing, unreadable or too short; the message names the file, never its content."""


def read_secret(path: str | os.PathLike) -> bytes:
    """The secret in `path` (surrounding whitespace stripped), at least 16 bytes."""
    try:
        secret = Path(path).read_bytes().strip()
    except OSError as e:
        raise SecretError(f"side channel secret file {str(path)!r} cannot be read: {e.strerror or e}") from e
    if len(secret) < _MIN_SECRET_BYTES:
        raise SecretError(f"side channel secret file {str(path)!r} holds {len(secret)} bytes; at least "
                          f"{_MIN_SECRET_BYTES} are needed (e.g. `openssl rand -hex 32 > FILE`)")
    return secret


class SideChannelAuth:
    """Seals requests (clients) and opens them (servers) with one shared secret."""

    def __init__(self, secret: bytes, *, max_age_s: float = MAX_AGE_S):
        if len(secret) < _MIN_SECRET_BYTES:
            raise SecretError(f"a side channel secret needs at least {_MIN_SECRET_BYTES} bytes, got {len(secret)}")
        self._secret = secret
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._seen: collections.OrderedDict[bytes, float] = collections.OrderedDict()
        self.refused: collections.Counter[str] = collections.Counter()

    def __repr__(self) -> str:
        return f"SideChannelAuth(max_age_s={self.max_age_s})"  # never the secret

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> SideChannelAuth:
        return cls(read_secret(path))

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()

    def seal(self, payload: bytes) -> bytes:
        head = os.urandom(_NONCE) + _STAMP.pack(time.time())
        return MAGIC + head + self._mac(head + payload) + payload

    def open(self, data: bytes) -> bytes | None:
        """The payload of an authentic, fresh, first-seen request; None (and the reason counted) otherwise."""
        if len(data) < _HEADER or not data.startswith(MAGIC):
            return self._refuse("unsealed")
        head = data[len(MAGIC):len(MAGIC) + _NONCE + _STAMP.size]
        mac = data[len(MAGIC) + len(head):_HEADER]
        payload = data[_HEADER:]
        if not hmac.compare_digest(mac, self._mac(head + payload)):
            return self._refuse("bad_mac")
        (stamp,) = _STAMP.unpack(head[_NONCE:])
        now = time.time()
        if abs(now - stamp) > self.max_age_s:
            return self._refuse("stale")
        nonce = head[:_NONCE]
        with self._lock:
            # Kept for twice the window: a request stamped up to max_age_s ahead stays fresh that much longer.
            while self._seen and next(iter(self._seen.values())) < now - 2 * self.max_age_s:
                self._seen.popitem(last=False)
            if nonce in self._seen:
                self.refused["replayed"] += 1
                return None
            self._seen[nonce] = now
        return payload

    def _refuse(self, reason: str) -> None:
        with self._lock:
            self.refused[reason] += 1
        return None
