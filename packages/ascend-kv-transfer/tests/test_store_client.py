"""Start-up against an absent master fails fast with an error naming the address and what was tried."""

import socket

import pytest

from ascend_kv_transfer.pool.options import parse_store_options
from ascend_kv_transfer.pool.store_client import PoolUnavailableError, StoreClient, code_name, probe_master


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_absent_master_is_a_named_error():
    port = _free_port()
    opts = parse_store_options({"master_server_address": f"127.0.0.1:{port}", "master_connect_timeout_s": 1.0})
    with pytest.raises(PoolUnavailableError) as err:
        StoreClient(opts, contribute=True, name="worker")  # fails in the probe, before Mooncake's own ~90 s wait
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "TCP connection attempts over 1 s" in message
    assert "ConnectionRefusedError" in message and "master_server_address" in message


def test_probe_accepts_a_listening_master():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        probe_master("127.0.0.1", s.getsockname()[1], 1.0)


def test_code_names():
    assert code_name(-704) == "-704 OBJECT_NOT_FOUND"
    assert code_name(-900).startswith("-900 RPC_FAIL")
    assert code_name(-12345) == "-12345 UNKNOWN"
