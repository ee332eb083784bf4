"""`ascend-contracts` / `ascend-vllm contracts`: exit codes, JSON shape, the table, and argument errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascend_contracts.cli import main
from ascend_contracts.cli import main as contracts_main


def test_check_exits_1_on_uncovered_p0_p1_and_prints_json(new_tree: Path, pins_file: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--vllm", str(new_tree), "--pins", str(pins_file), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["vllm_version"] == "2.0.0" and data["pins_checked"] == 7
    assert data["uncovered"] == 4 and data["blocking"] == 3
    assert {f["symbol"] for f in data["findings"] if f["covered_by"] is None} >= {"vllm.core.spec.plan"}


def test_check_exits_0_when_every_p0_p1_is_covered(old_tree: Path, pins_file: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--vllm", str(old_tree / "vllm"), "--pins", str(pins_file)]) == 0
    out = capsys.readouterr().out
    assert "vllm.core.planning" in out and out.splitlines()[-1].startswith("ok: 1 findings")


def test_baseline_reports_the_drift_between_two_releases(old_tree: Path, new_wheel: Path, pins_file: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code = contracts_main(["check", "--baseline", str(old_tree), "--vllm", str(new_wheel),
                             "--pins", str(pins_file)])
    out = capsys.readouterr().out
    assert code == 1 and "1.0.0 -> 2.0.0" in out.splitlines()[0]
    assert "'shared_by' removed; replaced by 'layers'" in out


def test_bad_arguments_exit_2_with_a_message(tmp_path: Path, pins_file: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check", "--vllm", str(tmp_path / "nope"), "--pins", str(pins_file)]) == 2
    assert "not a release like" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text("[[pins]]\nsymbol = 1\n")
    assert main(["check", "--pins", str(bad)]) == 2
    assert "'symbol' must be a dotted vLLM path" in capsys.readouterr().err
    assert main([]) == 2


def test_scan_subcommand_reports_unpinned_symbols(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pkg = tmp_path / "packages" / "ascend-x" / "src" / "ascend_x"
    pkg.mkdir(parents=True)
    (pkg / "upstream_pins.toml").write_text("")
    (pkg / "mod.py").write_text("import vllm.v1.request\n")
    assert contracts_main(["scan", "--root", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "-- ascend_x: 1 vLLM symbols used, 1 unpinned" in out and "vllm.v1.request  (import" in out
