"""The Mooncake demos as a user types them: `ascend-vllm demo-pd`, `demo-pd --serve` and `demo-pool`, each in its own
process (which makes its own loopback-only network namespace), held to what each prints as its claim: the
disaggregated (or pooled) answer equals the single engine's, and the KV actually moved."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from ascend_testkit.reach.collect import reach_env

pytestmark = [pytest.mark.engine, pytest.mark.mooncake]

DEMO_TIMEOUT_S = 900  # two cold engine starts on a loaded 2-core machine, then a few prompts
BLOCK = 128


DEMOS = {
    "pd": ("demo-pd", "--lengths", "127,129,300", "--max-tokens", "6"),
    "pd-serve": ("demo-pd", "--serve", "--lengths", "300", "--max-tokens", "6"),
    "pool": ("demo-pool", "--lengths", "300,600", "--max-tokens", "6"),
}


class _Demo:
    def __init__(self, args: tuple[str, ...], model: str, folder) -> None:
        env = {**os.environ, "VLLM_CACHE_ROOT": str(folder / "vllm-cache"), **reach_env()}
        env.pop("ASCEND_VLLM_SIMULATE", None)
        env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        self.args, self.log_path = args, folder / "demo.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "ascend_vllm.cli", *args, "--model", model, "--json"],
                                         env=env, text=True, stdout=subprocess.PIPE, stderr=log,
                                         start_new_session=True)
        self._report: dict | None = None

    def report(self) -> dict:
        if self._report is None:
            try:
                out, _ = self.proc.communicate(timeout=DEMO_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"{' '.join(self.args)} did not finish in {DEMO_TIMEOUT_S}s; log: {self.log_path}")
            lines = [line for line in out.splitlines() if line.startswith("{")]
            if self.proc.returncode != 0 or not lines:
                pytest.fail(f"{' '.join(self.args)} exited {self.proc.returncode}; stdout: {out[-2000:]}\nlog "
                            f"tail:\n{self.log_path.read_text()[-4000:]}")
            self._report = json.loads(lines[-1])
        return self._report

    def kill(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def demos(tmp_path_factory, model_dir):
    """The three demos started side by side (each in its own namespace, its engines on their own cores)."""
    running = {name: _Demo(args, model_dir, tmp_path_factory.mktemp(f"demo-{name}")) for name, args in DEMOS.items()}
    yield running
    for demo in running.values():
        demo.kill()


def test_demo_pd_decodes_what_the_single_engine_does_with_the_kv_pulled(demos):
    report = demos["pd"].report()
    rows = report["rows"]
    assert [r["prompt_tokens"] for r in rows] == [127, 129, 300]
    assert all(r["identical"] for r in rows), rows
    connector = report["decode_connector"]
    assert connector["pulls_ok"] == 3 and connector["pulls_failed"] == 0, connector
    # Each prompt's KV came over (its blocks, partial last block included), none recomputed on the decode side.
    assert connector["blocks_pulled"] >= sum(-(-n // BLOCK) for n in (127, 129, 300)) - 3, connector
    assert connector["bytes_pulled"] > 0 and all(r["kv_landed_ms"] is not None for r in rows), rows


def test_demo_pd_serve_answers_through_the_router_as_the_single_server(demos):
    report = demos["pd-serve"].report()
    assert report["identical"], report
    assert report["through_router"] == report["single_server"] and report["chunks"] >= 1, report
    assert report["kv_tokens_received_by_decode"] >= 2 * BLOCK, report  # the decode server took the prompt's KV


def test_demo_pool_serves_the_second_engine_from_the_first_engines_blocks(demos):
    report = demos["pool"].report()
    rows = report["rows"]
    assert all(r["identical"] for r in rows), rows
    for r in rows:  # engine B loads every full block engine A stored (the last token is always computed)
        assert r["pool_hit_tokens"] == (r["prompt_tokens"] - 1) // BLOCK * BLOCK, r
    assert report["engine_b"]["blocks_loaded"] >= sum((r["prompt_tokens"] - 1) // BLOCK for r in rows), report
    assert report["engine_b"]["load_failed_blocks"] == 0 and report["engine_a"]["objects_stored"] > 0, report
