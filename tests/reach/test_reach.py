"""Every module of every runtime package is reached by what this session's engine-level tests ran.

The engine hosts, the demo, the servers and the CLI runs of this session recorded coverage (`ascend_testkit.reach`);
the pytest process itself did not, so a module only unit tests reach does not count. A module counts when one of
its functions ran. Exceptions are listed here with their reason; NOT_YET_WIRED is a ratchet: each entry names the
open issue that wires it, and the test fails when a listed module becomes reached (take it off the list).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ascend_testkit.reach.collect import REACH_ENV
from ascend_testkit.reach.modules import executed_lines, reached, runtime_modules

TESTS = Path(__file__).resolve().parents[1]

# Modules no engine on this machine can run, and why.
CANNOT_RUN_HERE = {
    "ascend_core.upstream.errors": "raised only when the installed vLLM lacks a contract the plugin relies on; the "
                                   "vLLMs installed here meet it, so no engine here can start into it",
}
# Tools behind a CLI command: reached by the CLI runs of the session (tests/foundation), not by an engine.
CLI_TOOLS = ("ascend_core.contracts", "ascend_vllm.cli", "ascend_vllm.commands")
# Runtime modules no engine reaches yet: issue that wires each.
NOT_YET_WIRED: dict[str, str] = {}


def _whole_suite_ran(session: pytest.Session) -> list[str]:
    """Test files of tests/ neither this session nor a passed session beside it on the same reach folder ran (the
    check means nothing on a partial run; scripts/test-all runs tests/foundation beside the package suites)."""
    collected = {Path(str(item.path)).resolve() for item in session.items}
    for record in Path(os.environ[REACH_ENV]).glob("session-*.tests.json"):
        collected |= {Path(p) for p in json.loads(record.read_text())}
    expected = {p.resolve() for p in TESTS.rglob("test_*.py")}
    return sorted(str(p.relative_to(TESTS)) for p in expected - collected)


@pytest.fixture(scope="module")
def reach(request, host_pool) -> dict[str, bool]:
    missing = _whole_suite_ran(request.session)
    if missing:
        pytest.fail(f"the reach check reads what every engine suite of this session ran; run `pytest tests` "
                    f"(not collected here: {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''})")
    # A process writes its coverage when it exits: end the session's engine hosts now (this check runs last).
    leftovers = host_pool.close()
    assert not leftovers, f"engine hosts that would not exit (their reach is lost): {leftovers}"
    folder = os.environ[REACH_ENV]
    executed = executed_lines(folder)
    assert executed, f"no coverage data in {folder}: did the engine hosts record? (see ascend_testkit.reach)"
    return reached(runtime_modules(), executed)


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
