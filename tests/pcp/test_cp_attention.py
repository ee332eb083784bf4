"""Context-parallel prefill attention across two real processes (gloo on 127.0.0.1) equals single-process attention.

Both ranks run ascend_testkit.cp_step_driver: vLLM's distributed environment with a PCP group of 2, Ascend's PCP manager
partitioning prefills of several lengths (divisible, uneven, 1-3 tokens, past the largest capture size, and the
seed regression of 151 real local tokens against a 76-token descriptor), the engine's chunk attention over the K/V
all-gathered through vLLM's PCP group, and the global order restored through vLLM's PCP all-gather. The engine
suite (test_engine_pcp.py) runs the same code inside a real two-rank engine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

DRIVER = "ascend_testkit.cp_step_driver"
TIMEOUT_S = 420  # the vLLM import alone takes 10-60 s on a loaded 2-core machine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("pcp")
    env = dict(os.environ, VLLM_CACHE_ROOT=str(tmp / "vllm-cache"), GLOO_SOCKET_IFNAME="lo")
    port = _free_port()
    outs = [tmp / f"rank{r}.json" for r in range(2)]
    logs = [open(tmp / f"rank{r}.log", "w") for r in range(2)]  # noqa: SIM115 (closed below)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", DRIVER, str(r), "2", str(port), str(outs[r])],
            env=env,
            stdout=logs[r],
            stderr=subprocess.STDOUT,
        )
        for r in range(2)
    ]
    try:
        codes = [p.wait(timeout=TIMEOUT_S) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
        for f in logs:
            f.close()
    elapsed = time.perf_counter() - start
    if codes != [0, 0]:
        tails = "\n".join((tmp / f"rank{r}.log").read_text()[-3000:] for r in range(2))
        pytest.fail(f"workers exited {codes}:\n{tails}")
    result = [json.loads(o.read_text()) for o in outs]
    totals = [r["seconds_total"] for r in result]
    work = [round(r["seconds_total"] - r["seconds_init"], 2) for r in result]
    print(f"distributed PCP=2 check: {elapsed:.1f} s wall; per rank {totals} s, of which PCP steps {work} s")
    return result


def test_matches_single_process_attention(reports):
    steps = reports[0]["steps"]
    assert set(steps) == {"divisible", "uneven", "tiny", "past_capture", "seed"}
    for name, step in steps.items():
        assert step["max_abs_err"] < 1e-4, name


def test_no_rank_drops_a_real_token(reports):
    for report in reports:
        for name, step in report["steps"].items():
            assert step["tokens_intact"], name
            assert step["local_tokens_after_padding"] >= max(step["real_tokens_per_rank"]), name
    # Both ranks agree on the padded size (their all-gathers would hang or fail otherwise).
    for name in reports[0]["steps"]:
        assert {r["steps"][name]["local_tokens_after_padding"] for r in reports} == {
            reports[0]["steps"][name]["local_tokens_after_padding"]
        }


def test_uneven_and_long_prefills_are_planned_as_expected(reports):
    steps = reports[0]["steps"]
    assert sum(steps["uneven"]["real_tokens_per_rank"]) == 37 + 101 + 5
    assert steps["past_capture"]["descriptor"][0] == "NONE"  # 150 local tokens > the 128 capture size
    assert steps["past_capture"]["ran"] == "eager"
    assert steps["divisible"]["ran"] == "replay"


def test_seed_regression_151_tokens_against_76_token_descriptor(reports):
    seed = reports[0]["steps"]["seed"]
    assert seed["descriptor"] == ["PIECEWISE", 76]
    assert max(seed["real_tokens_per_rank"]) == 151
    assert seed["local_tokens_after_padding"] == 151
    assert seed["widened"] and seed["effective_descriptor"] == ["NONE", 151]


def test_buffers_never_move_across_steps_and_captures(reports):
    for report in reports:
        assert report["addresses_stable"]
        assert report["captured"] == [128, 64, 32, 16, 8]
