"""The pool's halves against a real mooncake_master (no engine): round trip, eviction, a raising store, a dead master.

All scenarios run in one helper process inside the loopback-only namespace (store_scenarios.py), each with its own
master; the tests assert on what it reports.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.mooncake
# Each scenario's master listens on BASE_PORT + 10 * i (+1 for metrics): below Linux's ephemeral range
# (32768-60999), where the engines still alive in the namespace hold random ports (a master on 51000/51030 collided
# with one twice in CI and exited at start-up).
BASE_PORT = 28000


@pytest.fixture(scope="module")
def scenarios(netns, tmp_path_factory, here):
    import os

    logs = tmp_path_factory.mktemp("store-scenarios")
    proc = netns.popen([sys.executable, str(here / "store_scenarios.py"), "all", str(BASE_PORT), str(logs)],
                       stdout=subprocess.PIPE, stderr=open(logs / "stderr.log", "wb"),  # noqa: SIM115
                       env=dict(os.environ))  # no engine in it: its reach does not count (tests/reach)
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate(timeout=10)
        raise
    assert proc.returncode == 0, (logs / "stderr.log").read_text(errors="replace")[-3000:]
    return json.loads(out.decode().strip().splitlines()[-1])


def _ok(result: dict) -> dict:
    assert "error" not in result, result["error"]
    return result


def test_roundtrip_between_two_workers(scenarios):
    r = _ok(scenarios["roundtrip"])
    # 2 blocks were computed locally; the pool held the next 6 (the 9th is partial, the last token is computed)
    assert r["hit_tokens"] == 6 * 16 and r["async"] is True
    assert r["load_blocks"] == [[102, 103, 104, 105, 106, 107]]
    assert r["equal"] and r["untouched"] and r["invalid"] == []
    assert r["a"]["objects_stored"] == 8 and r["a"]["objects_skipped_present"] == 8  # the second save skipped all
    assert r["b"]["blocks_loaded"] == 6 and r["b"]["bytes_loaded"] == 6 * 128 * 1024
    assert r["sent"] == ["r1"]


def test_evicted_blocks_are_load_errors(scenarios):
    r = _ok(scenarios["eviction"])
    assert r["present_before"] == 80 and r["evicted"] >= 4
    assert r["invalid"] == r["expect_invalid"] and len(r["invalid"]) == 4
    assert r["good_equal"]
    assert r["b"]["load_failed_blocks"] == 4 and r["b"]["blocks_loaded"] == 4
    # Every one of the 160 objects A saved was stored or counted as a failed put (the master may refuse some when it
    # finds nothing evictable), none lost from the books.
    a = r["a"]
    assert a["objects_stored"] + a["objects_skipped_present"] + a["put_failed_objects"] == 160 and a["pool_enabled"]


def test_a_save_that_outlives_the_wait_for_it_publishes_nothing(scenarios):
    r = _ok(scenarios["stalled_save"])
    assert r["gave_up_s"] < 1.0 and r["disabled"]  # wait_for_saves gave up and turned the pool off
    # The put ran on, over the blocks' new contents; what it published is gone again, nobody can load it.
    assert r["present_after"] == [False] * 4, r
    assert r["worker"]["abandoned_objects_removed"] == 4 and r["worker"]["pending_saves"] == 0


def test_raising_store_still_reports_the_request(scenarios):
    r = _ok(scenarios["put_raises"])
    assert r["sent"] == ["r"]
    fault = r["after_fault"]
    assert fault["save_errors"] == 1 and fault["put_failed_objects"] == 4 and fault["objects_stored"] == 0
    assert fault["pending_saves"] == 0 and fault["held_requests"] == 0 and fault["pool_enabled"]
    assert r["after"]["objects_stored"] == 4 and r["found"] == [64, True]  # the pool kept working


def test_dead_master_turns_the_pool_off(scenarios):
    r = _ok(scenarios["master_dies"])
    assert r["hit_before"] == [64, True] and r["hit_after"] == [0, False]
    assert r["invalid"] == [20, 21, 22, 23] and r["recv"] == ["load"] and r["sent"] == ["save"]
    assert r["scheduler_enabled"] is False and r["worker"]["pool_enabled"] is False
    assert "RPC_FAIL" in r["reason"] and f"127.0.0.1:{BASE_PORT + 30}" in r["reason"]  # master_dies: 4th scenario
    assert r["worker"]["pending_saves"] == 0 and r["worker"]["held_requests"] == 0


def test_save_planning(scenarios):
    r = _ok(scenarios["save_planning"])
    prompt_only, with_output = r["save_output_False"], r["save_output_True"]
    # prompt forward: its 3 full blocks; a decode step filling no block: nothing
    for plan in (prompt_only, with_output):
        assert plan["steps"][0] == [[[40, 41, 42]], [], []] and plan["steps"][1] == [[], [], []]
    # the 4th block holds prompt and output tokens: saved only with save_output_blocks
    assert prompt_only["steps"][2] == [[], [], []] and with_output["steps"][2] == [[[43]], [], []]
    # after a preemption the blocks are planned again from the first (present keys are skipped by the workers)
    assert prompt_only["steps"][3] == [[[40, 41, 42]], [], ["r"]]
    # a request that had saves is held when it finishes; the next step tells the workers to report it
    for plan in (prompt_only, with_output):
        assert plan["finished"] == [True, None] and plan["steps"][4] == [[], ["r"], []]
        assert plan["tracked_after"] == 0
