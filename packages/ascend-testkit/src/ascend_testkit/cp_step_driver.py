"""One PCP rank of the distributed context-parallel attention check (started twice by test_cp_attention.py).

Each rank joins vLLM's distributed environment on gloo (127.0.0.1), builds an `AscendPCPManager`, and for each step
(prefills of several lengths) plans the graph descriptor, partitions the global batch, computes q/k/v for its
local tokens, runs the engine's context-parallel attention (`ascend_platform.pcp.attention`: K/V all-gathered over
vLLM's PCP group, each chunk attending to its request's gathered keys as the manager's attention layout says), and
restores the global token order through the manager's `restore_for_sampling` (vLLM's PCP group all-gather). Rank 0
compares with single-process causal attention and writes a JSON report; both ranks check token coverage and buffer
addresses. Graph capture is staged in the manager's buffers and "captured" by the simulated lane's eager backend.

Usage: python -m ascend_testkit.cp_step_driver RANK WORLD PORT OUT_JSON
"""

from __future__ import annotations

import datetime
import json
import sys
import time

import torch
import torch.nn.functional as F

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, VOCAB, MAX_POS = 4, 2, 32, 997, 1024
MAX_NUM_REQS, MAX_NUM_TOKENS = 8, 1024
CAPTURE_SIZES = (8, 16, 32, 64, 128)
# (name, prefill lengths, forced descriptor tokens or None = planned). Odd lengths do not divide into 2·PCP chunks;
# 300 tokens put ~150 on each rank, past the largest capture size (128); "seed" is the 151-vs-76 regression.
STEPS = (
    ("divisible", (64, 32), None),
    ("uneven", (37, 101, 5), None),
    ("tiny", (1, 2, 3), None),
    ("past_capture", (300,), None),
    ("seed", (298, 2), 76),
)


def tables(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        name: torch.randn(rows, heads * HEAD_DIM, generator=g)
        for name, rows, heads in (
            ("q_tok", VOCAB, NUM_HEADS),
            ("q_pos", MAX_POS, NUM_HEADS),
            ("k_tok", VOCAB, NUM_KV_HEADS),
            ("k_pos", MAX_POS, NUM_KV_HEADS),
            ("v_tok", VOCAB, NUM_KV_HEADS),
        )
    }


def qkv(t: dict[str, torch.Tensor], ids: torch.Tensor, pos: torch.Tensor):
    ids, pos = ids.long(), pos.long()
    q = (t["q_tok"][ids] + 0.5 * t["q_pos"][pos]).view(-1, NUM_HEADS, HEAD_DIM)
    k = (t["k_tok"][ids] + 0.5 * t["k_pos"][pos]).view(-1, NUM_KV_HEADS, HEAD_DIM)
    v = t["v_tok"][ids].view(-1, NUM_KV_HEADS, HEAD_DIM)
    return q, k, v


def reference_attention(t, ids: torch.Tensor, pos: torch.Tensor, lens: list[int], scale: float) -> torch.Tensor:
    q, k, v = qkv(t, ids, pos)
    group = NUM_HEADS // NUM_KV_HEADS
    outs, start = [], 0
    for n in lens:
        sl = slice(start, start + n)
        qh = q[sl].transpose(0, 1)
        kh = k[sl].repeat_interleave(group, dim=1).transpose(0, 1)
        vh = v[sl].repeat_interleave(group, dim=1).transpose(0, 1)
        outs.append(F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale).transpose(0, 1))
        start += n
    return torch.cat(outs)


def main() -> int:
    rank, world, port, out_path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    t0 = time.perf_counter()
    from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
    from vllm.distributed.parallel_state import (
        destroy_distributed_environment,
        destroy_model_parallel,
        get_pcp_group,
        init_distributed_environment,
        initialize_model_parallel,
    )
    from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
    from vllm.v1.worker.gpu.input_batch import InputBuffers

    from ascend_platform.graph import EagerBackend, GraphCapturePlan
    from ascend_platform.pcp import AscendPCPManager
    from ascend_platform.pcp.attention import all_gather_kv, chunk_attention
    from ascend_testkit.pcp_batches import step_input_batch

    device = torch.device("cpu")
    scale = HEAD_DIM**-0.5
    report: dict = {"rank": rank, "steps": {}}
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(
            world_size=world,
            rank=rank,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=rank,
            backend="gloo",
            timeout=datetime.timedelta(seconds=60),
        )
        initialize_model_parallel(prefill_context_model_parallel_size=world, backend="gloo")
        t_init = time.perf_counter()
        pcp_group = get_pcp_group()
        manager = AscendPCPManager(
            world,
            pcp_group.rank_in_group,
            device,
            max_num_reqs=MAX_NUM_REQS,
            max_num_tokens=MAX_NUM_TOKENS,
            max_num_blocks_per_group=[MAX_POS // 32],
        )
        addresses = manager.buffers.addresses()
        plan = GraphCapturePlan(mode=CUDAGraphMode.PIECEWISE, capture_sizes=CAPTURE_SIZES, max_num_reqs=MAX_NUM_REQS)
        backend, graphs = EagerBackend(), {}
        for desc in plan.capture_descriptors():
            staged = manager.stage_capture_batch(desc.num_tokens, desc.num_reqs)
            assert manager.buffers.addresses() == addresses, "capture staging moved a buffer"
            assert staged.batch.input_ids.data_ptr() == addresses["input_ids"]
            graphs[desc] = backend.capture(lambda batch=staged.batch: batch.input_ids.sum())
        report["captured"] = [d.num_tokens for d in graphs]
        assert manager.buffers.addresses() == addresses
        empty_cache = torch.zeros(1, 32, NUM_KV_HEADS, HEAD_DIM)  # fresh prefills: no cached context to read
        t = tables()
        global_buffers = InputBuffers(MAX_NUM_REQS, MAX_NUM_TOKENS, device)
        for name, lens, forced in STEPS:
            total = sum(lens)
            g = torch.Generator().manual_seed(total)
            ids = torch.randint(0, VOCAB, (total,), generator=g, dtype=torch.int32)
            batch = step_input_batch(global_buffers, list(lens), token_ids=ids)
            dispatch = manager.num_tokens_for_dispatch(batch.num_scheduled_tokens, batch.is_prefilling_np)
            if forced is None:
                desc = plan.descriptor_for(len(lens), dispatch, decode_only=False)
            else:
                desc = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.PIECEWISE, num_tokens=forced, num_reqs=None)
            effective = manager.effective_descriptor(batch, desc)
            local = manager.partition_batch(batch, desc)
            n_real, n_pad = local.num_tokens, local.num_tokens_after_padding
            assert n_pad >= dispatch >= n_real, (name, n_pad, dispatch, n_real)
            assert local.input_ids.data_ptr() == addresses["input_ids"]
            assert local.positions.data_ptr() == addresses["positions"]
            assert local.query_start_loc.data_ptr() == addresses["query_start_loc"]
            assert local.seq_lens.data_ptr() == addresses["seq_lens"]
            q, k, v = qkv(t, local.input_ids, local.positions)
            gathered = all_gather_kv(k, v, pcp_group)
            layout = manager.attention_layout
            out_local = torch.zeros(n_pad, NUM_HEADS, HEAD_DIM)
            if layout is not None:  # a rank can hold no chunk at all (prefills of 1-3 tokens)
                assert layout.first_prefill_row == 0 and not layout.has_context
                table = torch.zeros(layout.num_prefill_rows, 1, dtype=torch.int32)
                chunk_attention(q[:n_real], gathered, HEAD_DIM, empty_cache, empty_cache, table, layout,
                                scale=scale, out=out_local[:n_real])
            graph = graphs.get(effective) if effective.cg_mode != CUDAGraphMode.NONE else None
            if graph is not None:
                graph.replay()
            ran = "replay" if graph is not None else "eager"
            restored, _, global_batch = manager.restore_for_sampling(out_local.reshape(n_pad, -1), None)
            assert global_batch is batch
            # Every real token of the step came back exactly once: the restored token ids equal the global ones.
            id_back, _, _ = manager.restore_for_sampling(local.input_ids[:, None].float(), None)
            tokens_intact = bool(torch.equal(id_back[:, 0].to(torch.int32), ids))
            assert tokens_intact, f"{name}: a real token was lost or duplicated across ranks"
            assert manager.buffers.addresses() == addresses, f"{name}: a buffer moved"
            entry = {
                "lens": list(lens),
                "descriptor": [str(desc.cg_mode), desc.num_tokens],
                "effective_descriptor": [str(effective.cg_mode), effective.num_tokens],
                "ran": ran,
                "real_tokens_per_rank": list(manager.last_plan.real_tokens_per_rank),
                "local_tokens_after_padding": n_pad,
                "widened": manager.last_plan.widened,
                "tokens_intact": tokens_intact,
            }
            if rank == 0:
                ref = reference_attention(t, ids, batch.positions[:total], list(lens), scale)
                err = (restored.view(total, NUM_HEADS, HEAD_DIM) - ref).abs().max().item()
                torch.testing.assert_close(restored.view(total, NUM_HEADS, HEAD_DIM), ref, atol=1e-4, rtol=1e-4)
                entry["max_abs_err"] = err
            report["steps"][name] = entry
        report["addresses_stable"] = manager.buffers.addresses() == addresses
        report["seconds_init"] = round(t_init - t0, 2)
        report["seconds_total"] = round(time.perf_counter() - t0, 2)
        destroy_model_parallel()
        destroy_distributed_environment()
    with open(out_path, "w") as f:
        json.dump(report, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
