"""The per-rank side-channel port scheme."""

import pytest

from ascend_kv_transfer.p2p.ports import engine_port, peer_offset, worker_port
from ascend_kv_transfer.ranks import RankCoords


def test_every_rank_gets_its_own_port():
    ports = set()
    for dp in range(2):
        for pp in range(2):
            for pcp in range(2):
                for tp in range(4):
                    r = RankCoords(dp_rank=dp, tp_rank=tp, tp_size=4, pp_rank=pp, pp_size=2, pcp_rank=pcp, pcp_size=2)
                    ports.add(worker_port(30000, r))
                    assert engine_port(30000, r) == 30000 + dp * 16
    assert ports == set(range(30000, 30032))


def test_out_of_range():
    with pytest.raises(ValueError, match="tp_rank"):
        RankCoords(tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="side_channel_port"):
        worker_port(65535, RankCoords(tp_rank=1, tp_size=2))


def test_peer_offset_lays_out_by_the_peers_tp_size():
    base = 30000
    for pp in range(2):
        for tp in range(2):
            me = RankCoords(tp_rank=tp, tp_size=2, pp_rank=pp, pp_size=2)
            # Equal sizes: the peer's worker with our own ranks, i.e. our own port layout.
            assert base + peer_offset(me, 2, tp) == worker_port(base, me)
            # A TP=4 peer: its worker of rank r in our pp stage.
            for r in range(4):
                assert base + peer_offset(me, 4, r) == worker_port(base, RankCoords(tp_rank=r, tp_size=4, pp_rank=pp,
                                                                                pp_size=2))
    with pytest.raises(ValueError, match="peer tp_rank=2 outside peer tp_size=2"):
        peer_offset(RankCoords(), 2, 2)
