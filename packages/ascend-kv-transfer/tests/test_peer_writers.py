"""Per-peer writer queues are bounded: a stalled peer's backlog stops growing, other peers are not held up."""

from __future__ import annotations

import threading
import time

from ascend_kv_transfer.p2p.peer_writers import PeerWriters


def test_a_stalled_peer_refuses_jobs_past_its_bound_and_other_peers_still_run():
    writers = PeerWriters(max_queued_per_peer=3)
    stalled, ran = threading.Event(), []
    try:
        assert writers.submit("slow", lambda: stalled.wait(10))
        assert all(writers.submit("slow", lambda i=i: ran.append(("slow", i))) for i in range(2))
        assert not writers.submit("slow", lambda: ran.append(("slow", "over")))  # 3 waiting: refused, not queued
        assert writers.refused == 1 and writers.waiting("slow") == 3
        assert writers.submit("fast", lambda: ran.append(("fast", 0)))
        deadline = time.monotonic() + 5
        while ("fast", 0) not in ran:
            assert time.monotonic() < deadline, "the other peer's job was held up"
            time.sleep(0.01)
        stalled.set()
        while writers.waiting("slow"):
            assert time.monotonic() < deadline, "the stalled peer's queue did not drain"
            time.sleep(0.01)
        assert [r for r in ran if r[0] == "slow"] == [("slow", 0), ("slow", 1)]
        assert writers.submit("slow", lambda: None)  # room again
    finally:
        stalled.set()
        writers.close()
