"""The transfer agent between real Mooncake engines on loopback (no vLLM): coalesced, chunked pulls that copy
the right bytes; DONE and timeout release; a failed batch marking the peer broken instead of a blind retry; and the
layerwise push's writes leaving the caller, waiting for their layer's KV, one peer never holding up another."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mooncake

SCRIPT = str(Path(__file__).parent / "agent_loopback.py")
LAYERS = 4  # agent_loopback.LAYERS


def _run(netns, mode: str, env: dict | None = None, args: tuple[str, ...] = ()) -> dict:
    import subprocess

    out = subprocess.run(netns.command([sys.executable, SCRIPT, mode, *args]), capture_output=True, timeout=120,
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
    rereg = r["reregistered"]
    assert rereg["epochs"] == [1, 2, 2]  # the consumer now holds the producer's metadata of the new registration
    assert not rereg["held_freed"][0] and "expired" in rereg["held_freed"][1]
    assert rereg["after"] == [True, None, True]
    assert rereg["released"] == ["req-f", "req-g", "req-h"]


def test_layerwise_writes_never_block_the_caller_wait_for_the_kv_and_isolate_peers(netns):
    r = _run(netns, "layerwise")
    assert r["destinations_known"]
    # The "forward pass" queued 8 layer writes, 4 of them for layers whose KV is not written yet, and went on (the
    # script itself opens the gate later: a caller that waited for it would never get there).
    # The other peer's transfer landed completely while the first one's writes waited for their KV.
    assert r["fast_landed_while_slow_waits"] and r["reports_before_gate"] == [["fast", True, None]]
    assert r["fast_bytes"] and not r["slow_bytes_before_gate"] and r["queued_before_gate"] == LAYERS
    assert r["slow_landed_after_gate"] and r["slow_bytes"]
    assert r["reports"] == [["fast", True, None], ["slow", True, None]]
    assert r["layer_pushes"] == 2 * LAYERS and r["writer_threads"] == 2


def test_a_side_channel_with_a_secret_answers_only_its_holders_and_honours_a_release(netns, tmp_path):
    secret = tmp_path / "side-channel.secret"
    secret.write_text("8f1c0e5a4b7d2e9f6a3c1b0d5e7f9a2c\n")
    r = _run(netns, "guarded", args=(str(secret),))
    # Without the secret (or with another one) nothing is answered, not even the metadata; each refusal counted.
    assert r["stranger"] == "no answer" and r["forged"] == "no answer"
    assert r["refused"] == {"unsealed": 1, "bad_mac": 1}
    assert r["pull_ok"] and r["bytes_equal"] and r["after_pull"] == ["req1"]
    # A release frees an unclaimed transfer at once (not at the 30 s abort timeout); a late claim hears "expired".
    assert list(r["release_unclaimed"].values()) == ["released"]
    assert r["after_release"] == ["req2"]
    assert "expired" in r["late_claim"]
    # A claimed transfer is its reader's to free: the release leaves it held.
    assert r["claimed"] and list(r["release_claimed"].values()) == ["kept (claimed)"] and r["held_claimed"] == 1
    # A release before the hold frees the blocks the moment the hold lands.
    assert list(r["release_early"].values()) == ["released"] and r["after_early_hold"] == ["req4"]
    # An unsealed release is not answered: the transfer stays held.
    assert list(r["unsigned_release"].values())[0].startswith("not released: no answer")
    assert r["stats"]["released_by_request"] == 2
