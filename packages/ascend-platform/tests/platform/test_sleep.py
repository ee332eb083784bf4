"""Sleep mode bookkeeping on a real torch module: tags, levels, weights restored bit for bit."""

from __future__ import annotations

import pytest
import torch

from ascend_platform.worker.sleep import SleepController


class _Runner:
    """Our runner's sleep surface (get_model, device, ascend_kv, release/reallocate) around a real module."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        self.model.register_buffer("table", torch.arange(4.0))
        self.device = torch.device("cpu")
        self.ascend_kv: object | None = object()
        self.events: list[str] = []

    def get_model(self) -> torch.nn.Module:
        return self.model

    def release_kv_cache(self) -> None:
        self.ascend_kv = None
        self.events.append("release")

    def reallocate_kv_cache(self) -> None:
        self.ascend_kv = object()
        self.events.append("reallocate")


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_level1_round_trip_by_tags():
    runner = _Runner()
    before = _state(runner.model)
    ctl = SleepController(runner)
    ctl.sleep(1)
    assert ctl.state()["weights_numel"] == 0 and runner.ascend_kv is None
    ctl.wake_up(["kv_cache"])
    assert ctl.state()["sleeping"] == ["weights"] and runner.events == ["release", "reallocate"]
    ctl.wake_up(["weights"])
    after = runner.model.state_dict()
    assert ctl.state()["sleeping"] == [] and all(torch.equal(before[k], after[k]) for k in before)


def test_level2_keeps_buffers_and_shapes_but_not_weights():
    runner = _Runner()
    ctl = SleepController(runner)
    ctl.sleep(2)
    ctl.wake_up()
    assert runner.model[0].weight.shape == (8, 8)  # storage is back, contents need a reload
    assert torch.equal(runner.model.table, torch.arange(4.0))


def test_bad_level_and_tag():
    ctl = SleepController(_Runner())
    with pytest.raises(ValueError, match="sleep level must be 1 or 2"):
        ctl.sleep(3)
    ctl.sleep(1)
    with pytest.raises(ValueError, match=r"unknown wake_up tag\(s\) \['weight'\]"):
        ctl.wake_up(["weight"])
