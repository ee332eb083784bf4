"""A namespace whose holder never reports is an error within the timeout, not a hang (needs root, like every
namespace user here)."""

from __future__ import annotations

import time

import pytest

from ascend_testkit.netns import LoopbackNamespace, NetnsUnavailableError


class _SilentHolder(LoopbackNamespace):
    HOLDER_SCRIPT = "exec sleep 30"


def test_a_holder_that_never_reports_fails_within_the_timeout():
    t0 = time.monotonic()
    with pytest.raises(NetnsUnavailableError, match=r"did not report within 0.5 s"):
        _SilentHolder(timeout_s=0.5)
    assert time.monotonic() - t0 < 5


def test_a_namespace_comes_up():
    with LoopbackNamespace(timeout_s=10) as ns:
        assert ns.pid > 0
