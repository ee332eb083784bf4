"""The per-rank side-channel port scheme."""

import pytest

from ascend_kv_transfer.p2p.ports import Ranks, engine_port, worker_port


def test_every_rank_gets_its_own_port():
    ports = set()
    for dp in range(2):
        for pp in range(2):
            for pcp in range(2):
                for tp in range(4):
                    r = Ranks(dp_rank=dp, tp_rank=tp, tp_size=4, pp_rank=pp, pp_size=2, pcp_rank=pcp, pcp_size=2)
                    ports.add(worker_port(30000, r))
                    assert engine_port(30000, r) == 30000 + dp * 16
    assert ports == set(range(30000, 30032))


def test_out_of_range():
    with pytest.raises(ValueError, match="tp_rank"):
        Ranks(tp_rank=2, tp_size=2)
    with pytest.raises(ValueError, match="side_channel_port"):
        worker_port(65535, Ranks(tp_rank=1, tp_size=2))
