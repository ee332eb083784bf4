"""Acceptance read from vLLM's spec-decode metrics, and floors that fail loudly."""

from __future__ import annotations

import pytest
from vllm.v1.metrics.reader import Counter, Vector
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from ascend_specdecode.metrics import (
    AcceptanceBelowFloor,
    AcceptanceFloorLogger,
    acceptance_from_metrics,
    acceptance_from_stats,
)


def metrics(drafts, draft_tokens, accepted, per_pos):
    labels = {"model_name": "m", "engine": "0"}
    return [
        Counter(name="vllm:spec_decode_num_drafts", labels=labels, value=drafts),
        Counter(name="vllm:spec_decode_num_draft_tokens", labels=labels, value=draft_tokens),
        Counter(name="vllm:spec_decode_num_accepted_tokens", labels=labels, value=accepted),
        Vector(name="vllm:spec_decode_num_accepted_tokens_per_pos", labels=labels, values=per_pos),
        Counter(name="vllm:generation_tokens", labels=labels, value=999),
    ]


def test_report_from_vllm_metrics():
    report = acceptance_from_metrics(metrics(10, 30, 24, [10, 8, 6]))
    assert report.acceptance_per_position == (1.0, 0.8, 0.6)
    assert report.mean_accepted_length == pytest.approx(3.4)
    assert report.acceptance_rate == pytest.approx(0.8)
    report.check_floor([0.99, 0.7, 0.5])
    with pytest.raises(AcceptanceBelowFloor, match=r"position 1: 0.800 < 0.900, position 2: 0.600 < 0.900"):
        report.check_floor(0.9, label="eagle")


def test_no_drafts_fails_any_floor():
    with pytest.raises(AcceptanceBelowFloor, match="speculation did not run"):
        acceptance_from_metrics(metrics(0, 0, 0, [0, 0]), 2).check_floor(0.0)


def test_delta_between_snapshots():
    before = acceptance_from_metrics(metrics(10, 30, 24, [10, 8, 6]))
    after = acceptance_from_metrics(metrics(30, 90, 84, [30, 28, 26]))
    assert after.minus(before).acceptance_per_position == (1.0, 1.0, 1.0)


def test_report_from_scheduler_stats_matches_vllm_counting():
    stats = SpecDecodingStats.new(3)
    stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=3)
    stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=1)
    report = acceptance_from_stats(stats)
    assert report.acceptance_per_position == (1.0, 0.5, 0.5)
    assert report.mean_accepted_length == 3.0


def test_floor_logger_warns_on_collapse():
    logger = AcceptanceFloorLogger.factory(floor=0.5, window=2)(None, 0)
    good, bad = SpecDecodingStats.new(2), SpecDecodingStats.new(2)
    good.observe_draft(2, 2)
    good.observe_draft(2, 2)
    bad.observe_draft(2, 0)
    bad.observe_draft(2, 0)
    logger.record(type("S", (), {"spec_decoding_stats": good})(), None)
    assert logger.alerts == 0
    logger.record(type("S", (), {"spec_decoding_stats": bad})(), None)
    assert logger.alerts == 1


def test_report_round_trips_through_json_dict():
    report = acceptance_from_metrics(metrics(10, 30, 24, [10, 8, 6]))
    from ascend_specdecode.metrics import AcceptanceReport

    assert AcceptanceReport.from_dict(report.as_dict()) == report


def test_floor_plugin_watches_the_first_position(monkeypatch):
    """vLLM builds stat-logger plugins as `cls(vllm_config, engine_index)`: the floor comes from the environment,
    on the first draft position only (a fair draft's later positions may sit near zero)."""
    from types import SimpleNamespace

    from vllm.v1.metrics.loggers import load_stat_logger_plugin_factories

    from ascend_specdecode.metrics import AcceptanceFloorPlugin

    assert AcceptanceFloorPlugin in load_stat_logger_plugin_factories()  # what vLLM's AsyncLLM adds to its loggers
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3))
    monkeypatch.setenv("ASCEND_SPECDECODE_ACCEPTANCE_WINDOW", "2")
    plugin = AcceptanceFloorPlugin(config, 0)
    assert plugin.floor == [0.05, 0.0, 0.0] and plugin.window == 2
    fair, collapsed = SpecDecodingStats.new(3), SpecDecodingStats.new(3)
    for _ in range(2):
        fair.observe_draft(3, 1)  # first position always accepted, the later ones never
        collapsed.observe_draft(3, 0)
    plugin.record(SimpleNamespace(spec_decoding_stats=fair), None)
    assert plugin.alerts == 0
    plugin.record(SimpleNamespace(spec_decoding_stats=collapsed), None)
    assert plugin.alerts == 1
    monkeypatch.setenv("ASCEND_SPECDECODE_ACCEPTANCE_FLOOR", "1.5")
    with pytest.raises(ValueError, match="ASCEND_SPECDECODE_ACCEPTANCE_FLOOR='1.5' is out of range"):
        AcceptanceFloorPlugin(config, 0)
