"""Which prefill TP rank each decode TP rank reads, and which prefill ranks it lets go unread."""

import zlib
from collections import Counter

import pytest

from ascend_kv_transfer.p2p.rank_groups import ReadPlan, plan_reads

IDS = [f"xfer-{i}" for i in range(64)]


def _engine_plan(decode_tp: int, prefill_tp: int, transfer_id: str) -> list[ReadPlan]:
    return [plan_reads(d, decode_tp, prefill_tp, replicated=True, transfer_id=transfer_id) for d in range(decode_tp)]


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_equal_sizes_pair_rank_to_rank(tp):
    for replicated in (False, True):
        assert [plan_reads(d, tp, tp, replicated=replicated, transfer_id="t") for d in range(tp)] == [
            ReadPlan(d) for d in range(tp)]


@pytest.mark.parametrize(("decode_tp", "prefill_tp"), [(1, 2), (1, 4), (2, 4), (2, 8), (4, 8)])
def test_larger_prefill_reads_one_copy_per_decode_rank_and_releases_the_rest(decode_tp, prefill_tp):
    for tid in IDS:
        plans = _engine_plan(decode_tp, prefill_tp, tid)
        sources = [p.source for p in plans]
        released = [r for p in plans for r in p.release]
        # One read per decode rank, each prefill rank either read once or released once, never both.
        assert len(set(sources)) == decode_tp and all(p.readers == 1 for p in plans)
        assert sorted(sources + released) == list(range(prefill_tp))
        k = prefill_tp // decode_tp
        for d, p in enumerate(plans):  # a decode rank stays inside its own group of identical latents
            assert {p.source, *p.release} == set(range(d * k, (d + 1) * k))


def test_the_pick_is_deterministic_and_spreads_over_the_group():
    assert plan_reads(0, 1, 2, replicated=True, transfer_id="abc") == plan_reads(0, 1, 2, replicated=True,
                                                                                 transfer_id="abc")
    assert plan_reads(0, 1, 2, replicated=True, transfer_id="abc").source == zlib.crc32(b"abc") % 2
    counts = Counter(plan_reads(1, 2, 8, replicated=True, transfer_id=t).source for t in IDS)
    assert set(counts) == {4, 5, 6, 7} and min(counts.values()) >= len(IDS) // 8, counts


@pytest.mark.parametrize(("decode_tp", "prefill_tp"), [(2, 1), (4, 1), (4, 2), (8, 2)])
def test_larger_decode_shares_each_prefill_rank_between_its_readers(decode_tp, prefill_tp):
    plans = _engine_plan(decode_tp, prefill_tp, "t")
    readers = Counter(p.source for p in plans)
    assert readers == {r: decode_tp // prefill_tp for r in range(prefill_tp)}
    assert all(p.readers == decode_tp // prefill_tp and p.release == () for p in plans)


def test_without_replication_ranks_pair_by_number_for_the_handshake_to_refuse():
    assert [plan_reads(d, 2, 1, replicated=False, transfer_id="t") for d in range(2)] == [ReadPlan(0), ReadPlan(0)]
    assert plan_reads(0, 1, 2, replicated=False, transfer_id="t") == ReadPlan(0)  # nothing released: no one reads


def test_bad_sizes_are_named():
    with pytest.raises(ValueError, match="prefill TP size 3 is not a multiple of decode TP size 2"):
        plan_reads(0, 2, 3, replicated=True, transfer_id="t")
    with pytest.raises(ValueError, match="decode TP size 3 is not a multiple of prefill TP size 2"):
        plan_reads(0, 3, 2, replicated=True, transfer_id="t")
    with pytest.raises(ValueError, match="decode_rank=2 outside decode_tp=2"):
        plan_reads(2, 2, 4, replicated=True, transfer_id="t")
    with pytest.raises(ValueError, match="prefill_tp=0"):
        plan_reads(0, 1, 0, replicated=True, transfer_id="t")
