"""Grading drift: each severity, coverage by adapters, renamed/moved hints, and the release-to-release mode."""

from __future__ import annotations

import json
from pathlib import Path

from ascend_contracts.checker import check
from ascend_contracts.drift import drift
from ascend_contracts.pins import load_pins
from ascend_contracts.report import render_table
from ascend_contracts.source_reader import open_source
from ascend_contracts.static_view import StaticView


def _by_symbol(report) -> dict[str, object]:
    return {f.symbol: f for f in report.findings}


def test_pins_match_the_release_they_were_written_against(old_tree: Path, pins_file: Path) -> None:
    report = check(load_pins(pins_file), StaticView(open_source(old_tree)))
    findings = _by_symbol(report)
    # only the optional module (absent in the old release) and the bogus adapter's pin are reported... and the
    # latter not at all, since Runner.build exists
    assert set(findings) == {"vllm.core.planning"}
    assert findings["vllm.core.planning"].severity == "P2"
    assert report.exit_code == 0 and report.blocking == 0


def test_every_severity_against_the_newer_release(new_tree: Path, pins_file: Path) -> None:
    report = check(load_pins(pins_file), StaticView(open_source(new_tree)))
    f = _by_symbol(report)

    renamed = f["vllm.core.spec.Tensor.shared_by"]
    assert renamed.severity == "P1" and "'layers' instead" in renamed.detail
    assert renamed.covered_by == "ascend_core.upstream.kv_tensor_layers"

    moved = f["vllm.core.spec.plan"]
    assert moved.severity == "P0" and moved.covered_by is None and moved.use == "patch"
    assert "now at vllm.core.planning.plan" in moved.detail

    default = f["vllm.core.spec.hook"]
    assert default.severity == "P2" and "flag: False -> True" in default.detail

    value = f["vllm.core.spec.GROUP"]
    assert value.severity == "P1" and "'vllm.my_group' -> 'vllm.other_group'" in value.detail

    param = f["vllm.core.runner.Runner.step(num_tokens_across_dp)"]
    assert param.severity == "P1" and "'dp_sync' instead" in param.detail
    assert param.covered_by == "ascend_core.upstream.speculator_dp_kwargs"

    # covered_by naming an adapter that does not exist covers nothing, and says so
    bogus = f["vllm.core.runner.Runner.build"]
    assert bogus.severity == "P0" and bogus.covered_by is None and "does not define" in bogus.detail

    assert "vllm.core.planning" not in f  # the optional module exists here
    assert report.blocking == 3 and report.exit_code == 1  # plan, GROUP, Runner.build
    assert report.uncovered == 4  # + the P2 default change


def test_json_and_table_carry_the_same_findings(new_tree: Path, pins_file: Path) -> None:
    report = check(load_pins(pins_file), StaticView(open_source(new_tree)))
    data = json.loads(report.to_json())
    assert data["uncovered"] == report.uncovered and data["blocking"] == report.blocking
    assert {tuple(sorted(f)) for f in data["findings"]} == {
        ("covered_by", "detail", "package", "refused", "severity", "symbol", "use")}
    assert [f["severity"] for f in data["findings"]] == sorted(f["severity"] for f in data["findings"])
    table = render_table(report)
    assert table.splitlines()[-1].startswith("FAIL: ")
    assert all(f.symbol in table for f in report.findings) and "UNCOVERED" in table


def test_kind_change_of_a_subclassed_class_is_p0(tmp_path: Path, new_tree: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text('[[pins]]\nsymbol = "vllm.core.spec.hook"\nkind = "class"\nuse = "subclass"\n')
    report = check(load_pins(path), StaticView(open_source(new_tree)))
    assert [(f.severity, f.symbol) for f in report.findings] == [("P0", "vllm.core.spec.hook")]
    assert "now a function" in report.findings[0].detail


def test_drift_between_two_releases_names_renames_moves_and_additions(old_tree: Path, new_tree: Path,
                                                                      pins_file: Path) -> None:
    old, new = StaticView(open_source(old_tree)), StaticView(open_source(new_tree))
    report = drift(load_pins(pins_file), old, new)
    f = _by_symbol(report)
    assert "replaced by 'layers'" in f["vllm.core.spec.Tensor.shared_by"].detail
    assert f["vllm.core.spec.Tensor.shared_by"].covered_by == "ascend_core.upstream.kv_tensor_layers"
    assert "vllm.core.spec.Tensor.layers" not in f  # reported once, as the rename
    plan = f["vllm.core.spec.plan"]
    assert plan.severity == "P0" and "now at vllm.core.planning.plan" in plan.detail
    assert "replaced by 'dp_sync'" in f["vllm.core.runner.Runner.step(num_tokens_across_dp)"].detail
    assert f["vllm.core.planning"].severity == "P2" and "added in 2.0.0" in f["vllm.core.planning"].detail
    assert f["vllm.core.spec.GROUP"].severity == "P1"
    assert report.version == "1.0.0 -> 2.0.0"
    assert drift(load_pins(pins_file), new, new).findings == []


class _RunningView(StaticView):
    """A release as the running vLLM sees it: it can say whether a feature is refused here (InstalledView can)."""

    def __init__(self, source, refusals: dict[str, str | None]):
        super().__init__(source)
        self.refusals = refusals

    def feature_refusal(self, adapter: str) -> str | None:
        return self.refusals[adapter]


_GATED = """
[[pins]]
symbol = "vllm.core.spec.plan"
kind = "function"
use = "patch"
refused_by = "ascend_core.upstream.mrv2_unavailable_reason"

[[pins]]
symbol = "vllm.core.runner.Runner.step"
kind = "method"
use = "override"
params = ["batch", "num_tokens_across_dp"]
optional = ["num_tokens_across_dp"]
"""


def test_refused_by_covers_a_finding_only_where_the_running_vllm_refuses_the_feature(tmp_path: Path,
                                                                                      new_tree: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(_GATED)
    gate = "ascend_core.upstream.mrv2_unavailable_reason"

    refused = check(load_pins(path), _RunningView(open_source(new_tree), {gate: "vLLM 2.0.0: no KV hooks"}))
    plan = _by_symbol(refused)["vllm.core.spec.plan"]
    assert plan.severity == "P0" and plan.covered_by == gate and plan.refused == "vLLM 2.0.0: no KV hooks"
    assert "refused at start-up here: vLLM 2.0.0: no KV hooks" in plan.detail and refused.blocking == 0

    runs = check(load_pins(path), _RunningView(open_source(new_tree), {gate: None}))
    plan = _by_symbol(runs)["vllm.core.spec.plan"]
    assert plan.covered_by is None and "does not refuse the feature" in plan.detail and runs.blocking == 1

    static = check(load_pins(path), StaticView(open_source(new_tree)))  # a wheel cannot say what would be refused
    plan = _by_symbol(static)["vllm.core.spec.plan"]
    assert plan.covered_by is None and "not evaluated" in plan.detail and static.blocking == 1


def test_an_optional_parameter_that_is_absent_is_p2(tmp_path: Path, new_tree: Path) -> None:
    path = tmp_path / "pins.toml"
    path.write_text(_GATED)
    step = _by_symbol(check(load_pins(path), StaticView(open_source(new_tree))))[
        "vllm.core.runner.Runner.step(num_tokens_across_dp)"]
    assert step.severity == "P2" and "absent (optional)" in step.detail and not step.blocking
