"""Every module, and every class, of every runtime package is reached by what this session's engine-level tests ran.

The engine hosts, the demo, the servers and the CLI runs of this session recorded coverage (`ascend_testkit.reach`);
the pytest process itself did not, so a module only unit tests reach does not count. A module counts when one of
its functions ran outside any import (what a module-level call runs at import is told apart and does not count).
Exceptions are listed here with their reason; NOT_YET_WIRED is a ratchet: each entry names the
open issue that wires it, and the test fails when a listed module becomes reached (take it off the list).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ascend_testkit.reach.collect import REACH_ENV
from ascend_testkit.reach.modules import executed_lines, reached, reached_classes, runtime_modules

TESTS = Path(__file__).resolve().parents[1]

# Modules no engine on this machine can run, and why.
CANNOT_RUN_HERE = {
    "ascend_core.upstream.errors": "raised only when the installed vLLM lacks a contract the plugin relies on; the "
                                   "vLLMs installed here meet it, so no engine here can start into it",
}
# Tools behind a CLI command: reached by the CLI runs of the session (tests/foundation), not by an engine.
CLI_TOOLS = ("ascend_vllm.cli", "ascend_vllm.commands")
# Runtime modules no engine reaches yet: issue that wires each.
NOT_YET_WIRED: dict[str, str] = {}
# Classes (`module:Class`) no engine of this machine runs a method of, and why; a ratchet like NOT_YET_WIRED.
CLASSES_NOT_REACHED: dict[str, str] = {
    "ascend_kernels.reference.chunk_threads:_Claims": "shares attention chunks between >= 2 intra-op threads; every "
        "engine here runs on one bound core (no helpers): only ascend-kernels' suite and benchmarks/kernels.py run it",
    "ascend_kv_transfer.p2p.layer_written:_DeviceEvent": "a layer's KV-written event on a device stream; the lanes "
        "here (CPU, emulated NPU) have no asynchronous streams and take the host variant: needs a card",
    "ascend_platform.simulated.triton_interpreter:InterpreterCompiler": "the placeholder Triton 'cpu' backend's "
        "compiler: registered so vLLM sees Triton, never asked to compile (the interpreter runs every kernel)",
    "ascend_platform.simulated.triton_interpreter:InterpreterDriver": "the same backend's driver: never active, so "
        "Triton never selects it for a compiled launch",
}


# Test files whose every test skips on this lane (vLLM 0.32.0), with where they run.
RUN_ELSEWHERE = {
    "platform/test_release_lane.py": "the release lane's own checks: they run on vLLM 0.27.1 (scripts/test-all's "
                                     "last stage) and skip here, naming the test of this lane that covers each",
}


def _whole_suite_ran(passed: set[str]) -> list[str]:
    """Test files of tests/ with no passed test in this session or in a passed session beside it on the same reach
    folder (the check means nothing on a partial run, nor over files whose tests all skipped; scripts/test-all runs
    tests/foundation beside the package suites)."""
    ran = {Path(p) for p in passed}
    for record in Path(os.environ[REACH_ENV]).glob("session-*.tests.json"):
        ran |= {Path(p) for p in json.loads(record.read_text())}
    expected = {p.resolve() for p in TESTS.rglob("test_*.py") if not p.is_relative_to(TESTS / "reach")}
    return sorted(str(p.relative_to(TESTS)) for p in expected - ran if str(p.relative_to(TESTS)) not in RUN_ELSEWHERE)


@pytest.fixture(scope="module")
def executed(request, host_pool, passed_test_files) -> dict[str, set[int]]:
    missing = _whole_suite_ran(passed_test_files)
    if missing:
        pytest.fail(f"the reach check reads what every engine suite of this session ran; run `pytest tests` "
                    f"(no passed test in: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''})")
    # A process writes its coverage when it exits: end the session's engine hosts now (this check runs last).
    leftovers = host_pool.close()
    assert not leftovers, f"engine hosts that would not exit (their reach is lost): {leftovers}"
    folder = os.environ[REACH_ENV]
    lines = executed_lines(folder)
    assert lines, f"no coverage data in {folder}: did the engine hosts record? (see ascend_testkit.reach)"
    return lines


@pytest.fixture(scope="module")
def reach(executed) -> dict[str, bool]:
    return reached(runtime_modules(), executed, executed_lines(os.environ[REACH_ENV], at_import=True))


@pytest.fixture(scope="module")
def class_reach(executed) -> dict[str, bool]:
    return reached_classes(runtime_modules(), executed, executed_lines(os.environ[REACH_ENV], at_import=True))


def test_every_runtime_module_is_reached_by_an_engine(reach):
    unreached = sorted(name for name, ok in reach.items() if not ok and name not in CANNOT_RUN_HERE
                       and name not in NOT_YET_WIRED and not name.startswith(CLI_TOOLS))
    assert not unreached, "runtime modules no engine-level test ran:\n  " + "\n  ".join(unreached)


def test_cli_tools_are_reached_by_cli_runs(reach):
    unreached = sorted(name for name, ok in reach.items() if name.startswith(CLI_TOOLS) and not ok)
    assert not unreached, "CLI modules no CLI run of the tests reached:\n  " + "\n  ".join(unreached)


def test_the_not_yet_wired_list_only_shrinks(reach):
    now_reached = sorted(name for name in NOT_YET_WIRED if reach.get(name))
    gone = sorted(name for name in {**NOT_YET_WIRED, **CANNOT_RUN_HERE} if name not in reach)
    assert not now_reached, f"reached now, take them off NOT_YET_WIRED: {now_reached}"
    assert not gone, f"listed modules that no longer exist: {gone}"


def test_every_runtime_class_is_reached_by_an_engine(class_reach):
    """Per class, not per module: a class counts when one of its own methods ran in an engine process (outside
    imports, or every one of them while its module built its declarations at import)."""
    unreached = sorted(name for name, ok in class_reach.items() if not ok and name not in CLASSES_NOT_REACHED
                       and name.split(":")[0] not in CANNOT_RUN_HERE and not name.startswith(CLI_TOOLS))
    assert not unreached, "runtime classes no engine-level test ran:\n  " + "\n  ".join(unreached)


def test_the_unreached_class_list_only_shrinks(class_reach):
    now_reached = sorted(name for name in CLASSES_NOT_REACHED if class_reach.get(name))
    gone = sorted(name for name in CLASSES_NOT_REACHED if name not in class_reach)
    assert not now_reached, f"reached now, take them off CLASSES_NOT_REACHED: {now_reached}"
    assert not gone, f"listed classes that no longer exist: {gone}"
