"""A server whose start hangs fails `wait_healthy` with the stacks of its processes in the error: where it hangs,
not only that it did."""

from __future__ import annotations

import sys
import time

import pytest

from ascend_testkit.servers import ServerProcess, ServerStartError

HANG = """
import threading, time
def stuck_in_registration():
    time.sleep(600)
threading.Thread(target=stuck_in_registration, name="kv-register").start()
time.sleep(600)
"""


def test_a_hung_start_reports_every_threads_stack(tmp_path):
    server = ServerProcess("hung", [sys.executable, "-c", HANG], port=1, env={}, log_path=tmp_path / "hung.log")
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        server.wait_healthy(timeout=3)
    message = str(err.value)
    assert "not healthy" in message and "Fatal Python error: Aborted" in message
    assert "in stuck_in_registration" in message  # the other thread's stack, not only the main one's
    assert not server.alive and time.monotonic() - t0 < 30
