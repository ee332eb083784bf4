"""The transfer agent between two real Mooncake engines on loopback (no vLLM): coalesced, chunked pulls that copy
the right bytes; DONE and timeout release; and a failed batch marking the peer broken instead of a blind retry."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mooncake

SCRIPT = str(Path(__file__).parent / "agent_loopback.py")


def _run(netns, mode: str, env: dict | None = None) -> dict:
    import subprocess

    out = subprocess.run(netns.command([sys.executable, SCRIPT, mode]), capture_output=True, timeout=120,
                         env=dict(os.environ, **(env or {})), check=False)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_pull_coalesces_chunks_and_releases(netns):
    r = _run(netns, "pull")
    assert r["ok"] and r["bytes_equal"] and r["untouched_equal"]
    assert r["entries"] == 2 * 4  # two contiguous runs x four layers
    assert r["calls"] == 3  # chunks of max_batch_entries=3
    assert r["nbytes"] == 15 * 4 * 4096
    assert r["finished_after_done"] == ["req1"]
    assert "unknown" in r["second_pull_error"]  # DONE freed it: a second claim finds nothing
    assert r["finished_after_timeout"] == ["req2"]
    assert "expired" in r["late_pull_error"]


def test_failed_batch_marks_peer_broken(netns):
    limits = {"MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER": "4", "MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER": "4"}
    r = _run(netns, "broken", limits)
    assert not r["first_ok"] and "BrokenPeerError" in r["first_error"]
    assert not r["second_ok"] and "broken" in r["second_error"] and "not retrying" in r["second_error"]
    assert r["second_s"] < 2
    assert r["released"] == ["req1", "req2"]  # the consumer released both transfers it gave up on


def test_step_driven_pulls_wait_for_the_hold_read_inline_or_on_the_thread_and_fail_cleanly(netns):
    r = _run(netns, "steps")
    assert r["waiting_before_hold"] == 2  # claimed before the prefill held anything: parked, not failed
    assert r["early_claims"] == {"a": [True, None], "b": [True, None]}
    assert r["early_bytes_equal"] and r["inline_reads"] == 2
    assert r["released_after_done"] == ["req-a", "req-b"]
    assert r["background"] == [True, 1, True]
    count, ok, error = r["expired"]
    assert count == 1 and not ok and "expired" in error
    ok, error, seconds = r["dead_peer"]
    assert not ok and "SideChannelTimeout" in error and seconds < 5
