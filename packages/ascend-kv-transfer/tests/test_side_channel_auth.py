"""Sealing side-channel requests with the deployment's secret: what a server accepts and what it refuses (and counts),
over a real ZMQ server on 127.0.0.1."""

from __future__ import annotations

import socket
import time

import pytest

from ascend_kv_transfer.options import MooncakeOptions, OptionError
from ascend_kv_transfer.p2p import schema
from ascend_kv_transfer.p2p.side_channel import SideChannelClient, SideChannelServer, SideChannelTimeout
from ascend_kv_transfer.p2p.side_channel_auth import SecretError, SideChannelAuth, read_secret

SECRET = b"0123456789abcdef0123456789abcdef"


def test_a_sealed_request_opens_once_and_a_tampered_stale_or_replayed_one_does_not():
    server, client = SideChannelAuth(SECRET), SideChannelAuth(SECRET)
    sealed = client.seal(b"payload")
    assert server.open(sealed) == b"payload"
    assert server.open(sealed) is None  # the same nonce again: a replay
    tampered = bytearray(client.seal(b"payload"))
    tampered[-1] ^= 1
    assert server.open(bytes(tampered)) is None
    assert server.open(b"payload") is None
    assert SideChannelAuth(b"another secret of enough length").open(client.seal(b"x")) is None
    strict = SideChannelAuth(SECRET, max_age_s=0.05)
    old = client.seal(b"late")
    time.sleep(0.1)
    assert strict.open(old) is None
    assert dict(server.refused) == {"replayed": 1, "bad_mac": 1, "unsealed": 1}
    assert dict(strict.refused) == {"stale": 1}


def test_the_secret_never_shows_and_a_bad_secret_file_is_named(tmp_path):
    assert "0123" not in repr(SideChannelAuth(SECRET))
    short = tmp_path / "short"
    short.write_text("tiny\n")
    with pytest.raises(SecretError, match=r"short.*holds 4 bytes"):
        read_secret(short)
    with pytest.raises(OptionError, match=r"side_channel_secret_file.*missing.*cannot be read"):
        MooncakeOptions(side_channel_secret_file=str(tmp_path / "missing"))
    good = tmp_path / "secret"
    good.write_bytes(SECRET + b"\n")
    assert MooncakeOptions(side_channel_secret_file=str(good)).side_channel_auth() is not None
    assert MooncakeOptions().side_channel_auth() is None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_with_a_secret_answers_only_sealed_requests():
    auth = SideChannelAuth(SECRET)
    server = SideChannelServer("127.0.0.1", _free_port(), lambda message: schema.Ack(), auth=auth)
    sealed, plain = SideChannelClient(2.0, auth=SideChannelAuth(SECRET)), SideChannelClient(0.3)
    try:
        assert isinstance(sealed.request(server.address, schema.MetadataRequest()), schema.Ack)
        with pytest.raises(SideChannelTimeout):
            plain.request(server.address, schema.MetadataRequest())
        assert server.refused == {"unsealed": 1}
    finally:
        sealed.close()
        plain.close()
        server.close()
