"""run_chunks: the caller and its helper threads share a kernel's chunks, one intra-op thread each."""

from __future__ import annotations

import threading

import pytest
import torch

from ascend_kernels.reference import attention, chunk_threads


@pytest.fixture
def two_intra_op_threads():
    previous = torch.get_num_threads()
    torch._C.set_num_threads(2)
    yield
    torch._C.set_num_threads(previous)


def test_two_threads_run_chunks_at_the_same_time_on_one_intra_op_thread_each(two_intra_op_threads):
    """Each of the first two items waits until the other has started: one thread alone would break the barrier."""
    both_started = threading.Barrier(2, timeout=30)
    seen: dict[int, tuple[int, int]] = {}

    def fn(i: int) -> int:
        if i < 2:
            both_started.wait()
        seen[i] = (threading.get_ident(), torch.get_num_threads())
        return i * i

    with attention._one_intra_op_thread():
        assert chunk_threads.run_chunks(fn, list(range(6)), threads=2) == [i * i for i in range(6)]
    assert len({ident for ident, _ in seen.values()}) == 2
    assert {count for _, count in seen.values()} == {1}
    assert torch.get_num_threads() == 2


def test_helpers_run_in_the_callers_inference_mode(two_intra_op_threads):
    both_started = threading.Barrier(2, timeout=30)

    def fn(i: int) -> tuple[bool, bool]:
        both_started.wait()
        return torch.is_inference_mode_enabled(), torch.is_grad_enabled()

    with attention._one_intra_op_thread(), torch.inference_mode():
        assert chunk_threads.run_chunks(fn, [0, 1], threads=2) == [(True, False)] * 2
    with attention._one_intra_op_thread(), torch.no_grad():
        assert chunk_threads.run_chunks(fn, [0, 1], threads=2) == [(False, False)] * 2


def test_one_thread_runs_everything_in_order_on_the_caller():
    caller = threading.get_ident()
    seen = []

    def fn(i: int) -> int:
        seen.append((i, threading.get_ident()))
        return -i

    assert chunk_threads.run_chunks(fn, [0, 1, 2], threads=1) == [0, -1, -2]
    assert seen == [(0, caller), (1, caller), (2, caller)]


def test_a_helpers_error_reaches_the_caller_and_stops_new_chunks(two_intra_op_threads, monkeypatch):
    failed = threading.Event()
    finish = chunk_threads._Claims.finish

    def finish_and_signal(self, i, result=None, error=None):
        finish(self, i, result, error)
        if error is not None:
            failed.set()

    monkeypatch.setattr(chunk_threads._Claims, "finish", finish_and_signal)
    started = []

    def fn(i: int) -> int:
        started.append(i)
        if threading.current_thread() is not threading.main_thread():
            raise ValueError(f"chunk {i} failed")
        assert failed.wait(30)  # the caller's chunk ends only once a helper's has failed
        return i

    with attention._one_intra_op_thread(), pytest.raises(ValueError, match="failed"):
        chunk_threads.run_chunks(fn, list(range(8)), threads=2)
    assert 1 <= len(started) <= 2  # each thread took at most one chunk; nothing started after the failure


def test_a_forked_child_gets_its_own_helpers(monkeypatch):
    mine = chunk_threads._helpers(1)
    assert chunk_threads._helpers(1) is mine
    monkeypatch.setattr(chunk_threads.os, "getpid", lambda: -1)  # a pid that has no pool yet
    assert chunk_threads._helpers(1) is not mine
