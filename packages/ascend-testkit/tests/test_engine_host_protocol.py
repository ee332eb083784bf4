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
