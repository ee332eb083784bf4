"""A TP rank whose KV another rank already puts (TP-replicated MLA latent) saves nothing and holds no request."""

from ascend_kv_transfer.pool.keys import PoolKeys
from ascend_kv_transfer.pool.scheduler_side import PoolTransfer
from ascend_kv_transfer.pool.worker_side import PoolWorker
from ascend_kv_transfer.ranks import RankCoords


def test_a_rank_that_leaves_saves_to_rank0_reports_finished_requests_at_once():
    worker = PoolWorker(client=None, keys=PoolKeys("ns"), rank=RankCoords(), layer_groups={}, layer_order={0: []},
                        num_blocks=4, inline_load_max_bytes=0, save_wait_timeout_s=1.0, saves=False)
    job = PoolTransfer(req_id="r", hashes=[b"h" * 16], block_ids=[[1]])
    worker.start_saves([job])  # no client call: the store is never touched
    worker.finish_requests(["r"])
    assert worker.get_finished() == ({"r"}, set())
    assert worker.stats.saves_left_to_rank0 == 1 and worker.stats.saves == 0
