"""The DP-argument forwarding and decode-only draft metadata every Ascend speculator adds to its upstream parent.

The parents below are stand-ins shaped like each vLLM lane's `BaseSpeculator.propose` (the probes in ascend_core do
the same), since an upstream speculator needs a loaded draft model to exist.
"""

from __future__ import annotations

import enum
import inspect
from dataclasses import dataclass

import pytest
import torch

from ascend_specdecode.speculators.base import AscendSpeculatorMixin, mark_decode_only


class LegacyLane:
    def propose(self, input_batch, num_tokens_across_dp=None, dummy_run=False):
        return ("legacy", num_tokens_across_dp, dummy_run)


class MidLane:
    def propose(self, input_batch, dp_sync=None, dummy_run=False):
        return ("mid", dp_sync, dummy_run)


class CurrentLane:
    def propose(self, input_batch, dp_sync_state=None, dummy_run=False):
        return ("current", dp_sync_state, dummy_run)


@dataclass
class SyncState:
    num_tokens_across_dp: object


@pytest.mark.parametrize("given", ["num_tokens_across_dp", "dp_sync", "dp_sync_state"])
@pytest.mark.parametrize("lane", [LegacyLane, MidLane, CurrentLane])
def test_propose_forwards_whichever_dp_argument(given, lane):
    spec = type("Spec", (AscendSpeculatorMixin, lane), {})()
    value = object()
    lane_name, forwarded, dummy = spec.propose("batch", **{given: value}, dummy_run=True)
    assert forwarded is value and dummy is True
    assert lane_name == {LegacyLane: "legacy", MidLane: "mid", CurrentLane: "current"}[lane]


def test_legacy_lane_gets_the_token_counts_of_a_sync_state():
    spec = type("Spec", (AscendSpeculatorMixin, LegacyLane), {})()
    counts = torch.tensor([3, 4])
    assert spec.propose("batch", dp_sync_state=SyncState(counts))[1] is counts


def test_two_dp_arguments_are_refused():
    spec = type("Spec", (AscendSpeculatorMixin, CurrentLane), {})()
    with pytest.raises(TypeError, match="several data-parallel arguments"):
        spec.propose("batch", dp_sync=1, dp_sync_state=2)


def test_installed_upstream_takes_dp_sync_state():
    from vllm.v1.worker.gpu.spec_decode.speculator import BaseSpeculator

    from ascend_specdecode.speculators.autoregressive import AscendEagleSpeculator

    assert "dp_sync_state" in inspect.signature(BaseSpeculator.propose).parameters
    assert AscendEagleSpeculator.propose is AscendSpeculatorMixin.propose


class AttnState(enum.Enum):
    PrefillNoCache = 0
    DecodeOnly = 1


@dataclass
class AscendMeta:
    attn_state: AttnState


@dataclass
class CpuMeta:
    seq_lens: int


def test_mark_decode_only_sets_ascend_state_and_leaves_others():
    metas = {"a": AscendMeta(AttnState.PrefillNoCache), "b": CpuMeta(3)}
    mark_decode_only(metas)
    assert metas["a"].attn_state is AttnState.DecodeOnly and metas["b"] == CpuMeta(3)
    assert mark_decode_only(None) is None


class Builder:
    def __init__(self):
        self.draft_is_prefilling = torch.ones(4, dtype=torch.bool)
        self.seen = None

    def _build_attn_metadata(self, num_reqs, **kwargs):
        self.seen = self.draft_is_prefilling.clone()
        return {"layer": AscendMeta(AttnState.PrefillNoCache)}


def test_draft_metadata_is_built_decode_only():
    spec = type("Spec", (AscendSpeculatorMixin, Builder), {})()
    meta = spec._build_attn_metadata(4, step=1)
    assert not spec.seen.any()
    assert meta["layer"].attn_state is AttnState.DecodeOnly
