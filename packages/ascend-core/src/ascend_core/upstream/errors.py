"""The one error the upstream contract layer raises when the installed vLLM does not fit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ascend_core.upstream.probes import ProbeResult

SUPPORTED_RANGE = ("vLLM 0.32.0 engine-tested in CI (current lane, >= 0.29); the legacy lane (<= 0.28) is probed "
                   "but not engine-tested yet")


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
