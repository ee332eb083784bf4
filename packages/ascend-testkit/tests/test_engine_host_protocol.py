"""The engine host's pipe protocol, on a real host process (no engine is started: these commands need none)."""

from __future__ import annotations

import json
import os

import pytest

from ascend_testkit.engine import EngineError, EngineHost
from ascend_testkit.engine.host import CommandReader


def test_a_command_read_with_another_is_not_lost():
    read_fd, write_fd = os.pipe()
    os.write(write_fd, b'{"op": "a"}\n{"op": "b"}\n')  # two commands arrive in one read
    reader = CommandReader(read_fd)
    assert reader.ready(1.0) and json.loads(reader.line()) == {"op": "a"}
    assert reader.ready(0) and json.loads(reader.line()) == {"op": "b"}  # without another read from the pipe
    os.close(write_fd)
    assert reader.ready(1.0) and reader.line() is None and reader.eof
    os.close(read_fd)


@pytest.fixture
def host(tmp_path):
    with EngineHost("protocol", lane="cpu", log_dir=tmp_path) as h:
        yield h


def test_replies_come_in_order_and_errors_name_the_command(host):
    host.send("free_blocks").send("no_such_command").send("stop")  # three in flight at once
    with pytest.raises(EngineError, match="no engine is running"):
        host.receive()
    with pytest.raises(EngineError, match="unknown engine host command 'no_such_command'"):
        host.receive()
    assert host.receive() is None  # stop without an engine is a no-op
    assert host.pid and host.alive


def test_private_methods_are_not_commands(host):
    with pytest.raises(EngineError, match="unknown engine host command '_engine'"):
        host.call("_engine")


def test_close_ends_the_process(host):
    host.close()
    assert not host.alive and host.proc.returncode == 0


def test_an_idle_host_retires_and_comes_back_on_its_next_command(host):
    assert host.call("stop") is None and host.idle
    first_pid = host.pid
    host.retire()
    assert host.retired and not host.alive and not host.idle and host.proc.returncode == 0
    assert host.call("stop") is None  # a fresh process answers
    assert host.alive and not host.retired and host.pid != first_pid


def test_a_host_with_a_command_under_way_is_not_retired(host):
    host.send("stop")
    with pytest.raises(EngineError, match="not idle"):
        host.retire()
    assert host.receive() is None and host.alive


def test_short_memory_retires_the_least_recently_used_idle_host_first(tmp_path, monkeypatch):
    from ascend_testkit.engine import pool as pool_module

    pool = pool_module.HostPool(tmp_path)
    try:
        older, newer = pool.get("older", lane="cpu", runner="v1"), pool.get("newer", lane="cpu", runner="v1")
        older.call("stop")
        newer.call("stop")  # used last
        monkeypatch.setattr(pool_module, "available_bytes", lambda: 1 << 20)
        assert pool_module.make_room(2 << 30) == []  # both used just now: part of the running test
        older.last_used -= 2 * pool_module.RECENT_S
        newer.last_used -= pool_module.RECENT_S + 1
        readings = [1 << 20]  # short once, then plenty: one host is enough
        monkeypatch.setattr(pool_module, "available_bytes", lambda: readings.pop() if readings else 64 << 30)
        assert pool_module.make_room(2 << 30) == ["older"]
        assert older.retired and newer.alive and pool.retirements == ["older"]
        assert pool.get("older", lane="cpu", runner="v1") is older  # the same host, back on its next command
        assert older.call("stop") is None and older.alive and older.spawns == 2
        older.last_used -= 2 * pool_module.RECENT_S
        monkeypatch.setattr(pool_module, "available_bytes", lambda: 1 << 20)
        assert pool_module.make_room(2 << 30, keep=older) == ["newer"]  # never the host about to start an engine
        assert "2 engine hosts; 2 retired while idle (to hold memory), 1 brought back" in pool.summary()
    finally:
        assert pool.close() == []


def test_idle_hosts_beyond_the_kept_number_are_retired_stalest_first(tmp_path, monkeypatch):
    from ascend_testkit.engine import pool as pool_module

    pool = pool_module.HostPool(tmp_path)
    try:
        hosts = [pool.get(f"h{i}", lane="cpu", runner="v1") for i in range(3)]
        for i, host in enumerate(hosts):
            host.call("stop")
            host.last_used -= 10 * pool_module.RECENT_S - i  # h0 stalest
        monkeypatch.setattr(pool_module, "available_bytes", lambda: 64 << 30)  # memory is not the reason
        monkeypatch.setenv("ASCEND_TESTKIT_IDLE_HOSTS", "1")
        assert pool_module.make_room() == ["h0", "h1"]
        assert [h.alive for h in hosts] == [False, False, True]
    finally:
        assert pool.close() == []
