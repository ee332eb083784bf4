"""Reading the reach data: every finished coverage file counts; an unreadable one fails the check, naming it."""

from __future__ import annotations

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
