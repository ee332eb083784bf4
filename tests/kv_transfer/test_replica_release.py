"""Transfer agents between real Mooncake engines on loopback (no vLLM) for KV every TP rank shares (MLA's latent):
decode ranks read one copy each across TP sizes, a prefill rank shared by two readers frees the transfer only after
both reported, a rank nobody reads frees it at once (also when told before its hold landed), KV whose heads are
split over ranks still refuses a TP mismatch by name, and TP sizes that do not divide fail the request, not the
worker."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.mooncake

SCRIPT = str(Path(__file__).parent / "replica_loopback.py")
LAYERS, PAGE = 2, 1024  # replica_loopback.LAYERS, .PAGE


@pytest.fixture(scope="module")
def findings(netns) -> dict:
    import subprocess

    out = subprocess.run(netns.command([sys.executable, SCRIPT]), capture_output=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr.decode()[-3000:]
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_two_readers_of_one_prefill_rank_free_it_after_the_second(findings):
    r = findings["readers"]
    assert r["plans"] == [[0, 2], [0, 2]]  # both decode ranks read prefill rank 0, each knowing there are two
    assert r["copies_equal"] == [True, True]
    assert r["finished_after_each_reader"] == [[], ["req1"]]  # not freed under the second reader
    assert r["held_now"] == 0 and r["released_done"] == 1


def test_the_rank_nobody_reads_frees_at_once_and_the_read_rank_after_the_read(findings):
    for tid, r in findings["unread"].items():
        assert r["notice"] == ["Ack", "None"], (tid, r)
        assert r["unread_freed"] == [f"req-{tid}"], tid  # before the decode even claimed from the other rank
        assert r["source_held_before_read"] == 1, tid
        assert r["ok"] and r["bytes_equal"] and r["nbytes"] == 2 * LAYERS * PAGE, (tid, r)  # one copy
        assert r["source_freed"] == [f"req-{tid}"], tid
    done, unread, expired, held = (sum(col) for col in zip(*findings["unread_stats"], strict=True))
    assert (done, unread, expired, held) == (2, 2, 0, 0), findings["unread_stats"]


def test_split_heads_refuse_another_tp_size_by_name(findings):
    r = findings["split"]
    assert not r["ok"] and "GeometryMismatchError" in r["error"] and "tp_size is 1 here but 2" in r["error"], r


def test_tp_sizes_that_do_not_divide_fail_the_request_for_recompute(findings):
    r = findings["ragged"]
    assert r["recving"] == ["req-r"] and r["invalid"] == [4, 5] and r["pulls_failed"] == 1, r
    assert "prefill TP size 3 is not a multiple of decode TP size 2" in r["error"], r
