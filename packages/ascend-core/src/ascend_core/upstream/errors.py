"""The one error the upstream contract layer raises when the installed vLLM does not fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ascend_core.upstream.probes import ProbeResult

# What CI shows, and nothing more: the engine suites run on these releases (scripts/test-all, one stage each) ...
ENGINE_TESTED = {
    "0.27.1": "legacy lane, a chosen subset on the V1 runner: the platform's engine against plain vLLM CPU 0.27.1, "
              "PD over Mooncake, offloading, EAGLE, the contract check; refused at start-up there by probe: Model "
              "Runner V2, MLA models, DFlash2 drafts, the KV pool and layerwise Mooncake connectors",
    "0.32.0": "current lane, every engine suite, V1 and Model Runner V2",
}
# ... and ascend-core's contract pins are checked against these release wheels without running them
# (packages/ascend-contracts/tests/test_wheels.py); the probes decide the lane of any other release.
STATIC_ONLY = ("0.28.0", "0.33.0")
SUPPORTED_RANGE = (
    "vLLM " + " and ".join(f"{v} ({lane})" for v, lane in ENGINE_TESTED.items()) + ", engine-tested in CI; "
    + ", ".join(STATIC_ONLY) + ": ascend-core's contract pins checked statically only, never run"
)


class UpstreamContractError(RuntimeError):
    """The installed vLLM lacks something the Ascend plugin relies on.

    Lists every failed probe at once, so a user sees the whole gap rather than the first AttributeError.
    """

    def __init__(self, failed: Sequence[ProbeResult], vllm_version: str | None = None):
        self.failed = list(failed)
        self.vllm_version = vllm_version
        lines = [
            f"installed vLLM ({vllm_version or 'not installed'}) does not meet the Ascend plugin's upstream "
            f"contract; supported: {SUPPORTED_RANGE}. Failed probes:"
        ]
        lines += [f"  - {p.name}: {p.detail}" for p in self.failed]
        super().__init__("\n".join(lines))
