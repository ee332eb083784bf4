"""Pool keys and block hashes: one object per block per rank per group; hashes equal across PYTHONHASHSEEDs."""

import json
import os
import subprocess
import sys

import pytest

from ascend_kv_transfer.pool.block_hashes import ROOT_HASH, RequestHashes, chain_hash
from ascend_kv_transfer.pool.keys import PoolKeys, pool_namespace
from ascend_kv_transfer.ranks import RankCoords


def _request(req_id, tokens, **kwargs):
    from vllm import SamplingParams
    from vllm.v1.request import Request

    return Request(req_id, list(tokens), SamplingParams(max_tokens=4), None, **kwargs)


def test_rank_coords():
    sizes = RankCoords(tp_size=2, pp_size=2, dcp_size=2)
    ranks = sizes.all_ranks()
    assert len(ranks) == 8 and len({r.tag for r in ranks}) == 8
    assert ranks[0].tag == "tp0-2.pp0-2.pcp0-1.dcp0-2"
    with pytest.raises(ValueError, match="tp_rank=2 outside tp_size=2"):
        RankCoords(tp_rank=2, tp_size=2)


def test_key_layout():
    keys = PoolKeys(pool_namespace("/models/org/llama-3-8b", ("geometry",)))
    h = chain_hash(ROOT_HASH, [1, 2, 3])
    key = keys.key(RankCoords(tp_rank=1, tp_size=2), 0, h)
    assert key.startswith("akv1/org_llama-3-8b/") and key.endswith(f"/tp1-2.pp0-1.pcp0-1.dcp0-1/g0/{h[:16].hex()}")
    assert len(keys.block_keys(RankCoords(tp_size=2).all_ranks(), [0, 1], h)) == 4
    # a different model or layout is a different namespace
    assert pool_namespace("/models/org/llama-3-8b", ("geometry",)) != pool_namespace("/x/org/llama-3-8b", ("geometry",))
    assert pool_namespace("m", ("a",)) != pool_namespace("m", ("b",))


def test_chain_depends_on_every_earlier_block_and_extra_keys():
    a = chain_hash(ROOT_HASH, [1, 2])
    assert chain_hash(a, [3, 4]) != chain_hash(chain_hash(ROOT_HASH, [1, 5]), [3, 4])
    assert chain_hash(ROOT_HASH, [1, 2], (("cache_salt", "s"),)) != a
    assert chain_hash(ROOT_HASH, [1, 2]) == a


def test_request_hashes_extend_and_respect_vllm_extra_keys():
    hashes = RequestHashes(block_size=4)
    req = _request("r1", range(10))
    assert len(hashes.get(req, 1)) == 1
    full = hashes.get(req, 5)
    assert len(full) == 2  # only full blocks
    assert full[0] == chain_hash(ROOT_HASH, [0, 1, 2, 3]) and full[1] == chain_hash(full[0], [4, 5, 6, 7])
    salted = RequestHashes(block_size=4).get(_request("r2", range(10), cache_salt="tenant-a"), 2)
    assert salted[0] != full[0]
    hashes.drop("r1")
    assert len(hashes) == 0


_CHILD = """
import json, sys
from vllm import SamplingParams
from vllm.v1.request import Request
from ascend_kv_transfer.pool.block_hashes import RequestHashes
req = Request("x", list(range(300)), SamplingParams(max_tokens=1), None)
print(json.dumps([h.hex() for h in RequestHashes(128).get(req, 2)] + [str(hash("seed-dependent"))]))
"""


def test_hashes_do_not_depend_on_pythonhashseed():
    seed = "7" if os.environ.get("PYTHONHASHSEED") != "7" else "8"
    done = subprocess.run([sys.executable, "-c", _CHILD], env=dict(os.environ, PYTHONHASHSEED=seed),
                          capture_output=True, text=True, timeout=300, check=True)
    child = json.loads(done.stdout.strip().splitlines()[-1])
    assert child[-1] != str(hash("seed-dependent"))  # the two processes really hash str differently
    here = RequestHashes(128).get(_request("x", range(300)), 2)
    assert child[:2] == [h.hex() for h in here]
