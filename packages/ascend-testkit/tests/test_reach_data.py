"""Reading the reach data: every finished coverage file counts; an unreadable one fails the check, naming it."""

from __future__ import annotations

from pathlib import Path

import pytest
from coverage import CoverageData

from ascend_testkit.reach.modules import UnreadableReachData, executed_lines


def test_an_unreadable_data_file_fails_naming_it_and_readable_ones_count(tmp_path):
    measured = tmp_path / "module.py"
    measured.write_text("x = 1\ny = 2\n")
    data = CoverageData(basename=str(tmp_path / ".coverage.host.pid1.abc"))
    data.add_lines({str(measured): [1, 2]})
    data.write()
    assert executed_lines(tmp_path) == {str(measured.resolve()): {1, 2}}
    (tmp_path / ".coverage.host.pid2.def").write_bytes(b"SQLite format 3\x00" + b"\x00" * 20)  # cut short
    with pytest.raises(UnreadableReachData, match=r"\.coverage\.host\.pid2\.def cannot be read"):
        executed_lines(tmp_path)


def test_a_host_killed_on_purpose_keeps_what_it_ran(tmp_path, monkeypatch):
    """Fault tests kill shared hosts that served other suites before: the kill writes their reach first."""
    from ascend_testkit.engine import EngineHost
    from ascend_testkit.reach.collect import REACH_ENV

    monkeypatch.setenv(REACH_ENV, str(tmp_path / "reach"))
    host = EngineHost("killed", lane="cpu", log_dir=tmp_path, setup=["ascend_kernels.npu_probe:torch_npu_status"])
    try:
        assert host.call("busy") is False  # the host answers (no engine needed)
        host.kill()
        assert not host.alive
    finally:
        host.close()
    probe = [path for path in executed_lines(tmp_path / "reach") if path.endswith("ascend_kernels/npu_probe.py")]
    assert probe, "the killed host's coverage was lost"



def _function_lines(path: str, name: str) -> set[int]:
    import ast

    from ascend_testkit.reach.modules import _function_body_lines

    tree = ast.parse(Path(path).read_text())
    return next(_function_body_lines(n) for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_what_an_import_runs_is_told_apart_from_what_runs_after(tmp_path, monkeypatch):
    """A process recording reach imports `ascend_kernels.ops`, whose module body calls `_reexport_families()`, then
    calls `torch_npu_status()`: the first counts only as run at import, the second as run."""
    import os
    import subprocess
    import sys

    import ascend_kernels.npu_probe
    import ascend_kernels.ops
    from ascend_testkit.reach.collect import reach_env

    monkeypatch.setenv("ASCEND_TESTKIT_REACH", str(tmp_path / "reach"))
    code = ("import ascend_kernels.ops\n"
            "from ascend_kernels.npu_probe import torch_npu_status\n"
            "torch_npu_status()\n")
    out = subprocess.run([sys.executable, "-c", code], env={**os.environ, **reach_env()}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # Coverage starts from its .pth hook before the workspace's editable paths exist: its plug-in must import there.
    assert "Error processing line" not in out.stderr and "No module named" not in out.stderr, out.stderr
    run, every = executed_lines(tmp_path / "reach"), executed_lines(tmp_path / "reach", at_import=True)
    ops = str(Path(ascend_kernels.ops.__file__).resolve())
    helper = _function_lines(ops, "_reexport_families")
    assert helper & every[ops] and not helper & run.get(ops, set())
    probe = str(Path(ascend_kernels.npu_probe.__file__).resolve())
    assert _function_lines(probe, "torch_npu_status") & run[probe]

MODULE = '''
def helper():
    return 1


def served():
    return 2


VALUE = helper()
'''


def test_a_module_counts_by_what_its_functions_ran_outside_imports(tmp_path):
    from ascend_testkit.reach.modules import Module, reached

    path = tmp_path / "module.py"
    path.write_text(MODULE)
    module, key = Module("m", path), str(path)
    helper, served, body = {3}, {7}, {10}
    # Only the import ran, and `served` never ran: not reached (what the import ran proves nothing).
    assert reached([module], {}, {key: helper | body}) == {"m": False}
    # `served` ran after the import: reached.
    assert reached([module], {key: served}, {key: helper | served | body}) == {"m": True}
    # Every function ran while the module was imported (helpers building its declarations): reached by the import.
    assert reached([module], {}, {key: helper | served | body}) == {"m": True}
    # Never imported.
    assert reached([module], {}, {}) == {"m": False}


CLASSES = '''
class Table:
    def __init__(self):
        self.rows = {}


class Entry:
    def __init__(self, name):
        self.name = name

    def check(self):
        return self.name


TABLE = Table()
ENTRY = Entry("x")
'''


def test_a_class_counts_by_its_methods_and_a_declaration_by_its_import(tmp_path):
    from ascend_testkit.reach.modules import Module, reached_classes

    path = tmp_path / "classes.py"
    path.write_text(CLASSES)
    module, key = Module("m", path), str(path)
    table_init, entry_init, entry_check, body = {4}, {9}, {12}, {15, 16}
    # Built at import and nothing after: Table's only method ran at import (a declaration); Entry.check never ran.
    assert reached_classes([module], {}, {key: table_init | entry_init | body}) == {"m:Table": True,
                                                                                   "m:Entry": False}
    # Entry.check ran after the import: reached.
    assert reached_classes([module], {key: entry_check},
                           {key: table_init | entry_init | entry_check | body})["m:Entry"] is True
    # Never imported: neither counts.
    assert reached_classes([module], {}, {}) == {"m:Table": False, "m:Entry": False}
