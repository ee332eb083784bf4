"""Run coalescing, per-layer entries and chunking under Mooncake's per-peer queue limit."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ascend_kv_transfer.p2p.plan import Run, build_entries, chunk, coalesce_runs, merge, plan_groups
from ascend_kv_transfer.p2p.schema import LayerRegion


def test_coalesce_runs_breaks_where_either_side_jumps():
    assert coalesce_runs([4, 5, 6, 9, 10], [0, 1, 2, 3, 4]) == [Run(4, 0, 3), Run(9, 3, 2)]
    assert coalesce_runs([1, 2, 3], [7, 9, 10]) == [Run(1, 7, 1), Run(2, 9, 2)]
    assert coalesce_runs([], []) == []


@given(st.lists(st.tuples(st.integers(0, 50), st.integers(0, 50)), max_size=60))
def test_coalesce_runs_covers_every_pair_in_order(pairs):
    local = [a for a, _ in pairs]
    remote = [b for _, b in pairs]
    runs = coalesce_runs(local, remote)
    expanded = [(r.local_start + i, r.remote_start + i) for r in runs for i in range(r.length)]
    assert expanded == pairs
    for a, b in zip(runs, runs[1:], strict=False):
        assert not (b.local_start == a.local_start + a.length and b.remote_start == a.remote_start + a.length)


def _region(name, base, stride, page, blocks=100):
    return LayerRegion(name=name, base_addr=base, block_stride=stride, page_bytes=page, num_blocks=blocks)


def test_dense_layers_give_one_entry_per_layer_and_run():
    pairs = [(_region(f"l{i}", 1000 * i, 10, 10), _region(f"l{i}", 50000 + 1000 * i, 10, 10)) for i in range(3)]
    runs = coalesce_runs([1, 2, 3, 7], [5, 6, 7, 8])
    entries = build_entries(pairs, runs)
    assert len(entries) == 3 * 2
    assert entries.local[:2] == [10, 70] and entries.remote[:2] == [50050, 50080]
    assert entries.lengths[:2] == [30, 10]
    assert entries.nbytes == 3 * 4 * 10


def test_padded_pages_fall_back_to_one_entry_per_page():
    pairs = [(_region("l", 0, 16, 10), _region("l", 1000, 16, 10))]
    entries = build_entries(pairs, [Run(2, 3, 3)])
    assert entries.local == [32, 48, 64] and entries.remote == [1048, 1064, 1080] and entries.lengths == [10] * 3


def test_chunks_stay_under_the_limit_and_keep_order():
    pairs = [(_region("l", 0, 1, 1, 5000), _region("l", 0, 1, 1, 5000))]
    entries = build_entries(pairs, coalesce_runs(list(range(0, 5000, 2)), list(range(0, 5000, 2))))
    assert len(entries) == 2500
    batches = chunk(entries, 1000)
    assert [len(b) for b in batches] == [1000, 1000, 500]
    assert sum((b.local for b in batches), []) == entries.local


def test_entries_count_the_bytes_of_each_layer_and_merge_sums_them():
    pairs = [(_region("a", 0, 10, 10), _region("a", 5000, 10, 10)), (_region("b", 2000, 16, 12),
                                                                        _region("b", 9000, 16, 12))]
    first = build_entries(pairs, coalesce_runs([1, 2, 5], [3, 4, 9]))
    assert first.layer_bytes == {"a": 30, "b": 36}
    assert sum(first.layer_bytes.values()) == first.nbytes
    second = build_entries(pairs[:1], [Run(7, 7, 2)])
    both = merge([first, second])
    assert both.layer_bytes == {"a": 50, "b": 36}
    assert both.local == first.local + second.local and both.lengths == first.lengths + second.lengths
    assert build_entries(pairs, []).layer_bytes == {}  # a group with nothing to move reports no layer


def _grouped(name, group, base, stride, page, blocks=100):
    return LayerRegion(name=name, base_addr=base, block_stride=stride, page_bytes=page, num_blocks=blocks,
                       group=group)


def test_groups_of_a_hybrid_model_read_their_own_blocks_window_tails_aligned_from_the_end():
    # Like DeepSeek V4: a full group (two layers of different pages in one block) and a sliding-window group whose
    # layer shares the first layer's tensor. The peer lists its out-of-window blocks as its null block 0.
    pairs = [(_grouped("full.a", 0, 0, 100, 100), _grouped("full.a", 0, 50_000, 100, 100)),
             (_grouped("full.b", 0, 20_000, 40, 40), _grouped("full.b", 0, 70_000, 40, 40)),
             (_grouped("swa", 1, 0, 100, 60), _grouped("swa", 1, 50_000, 100, 60))]
    entries = plan_groups(pairs, [[3, 4], [7, 8, 9]], [[10, 11], [0, 0, 0, 0, 21, 22, 23]])
    assert entries.layer_bytes == {"full.a": 200, "full.b": 80, "swa": 180}
    reads = sorted(zip(entries.local, entries.remote, entries.lengths, strict=True))
    assert reads == sorted([(300, 51_000, 200), (20_120, 70_400, 80),  # runs of dense pages: one read each
                            (700, 52_100, 60), (800, 52_200, 60), (900, 52_300, 60)])  # padded: one per page
    # Nothing to load in a group (a prefix hit covered it): no reads there.
    assert plan_groups(pairs, [[3, 4], []], [[10, 11], [0, 21]]).layer_bytes == {"full.a": 200, "full.b": 80}


def test_a_group_wanting_more_blocks_than_the_peer_lists_fails_the_pull():
    pairs = [(_grouped("swa", 1, 0, 100, 60), _grouped("swa", 1, 50_000, 100, 60))]
    with pytest.raises(RuntimeError, match="group 1: 3 blocks to load but the peer holds 2"):
        plan_groups(pairs, [[], [7, 8, 9]], [[], [21, 22]])
