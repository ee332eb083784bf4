"""Streams and events of the emulated card. Work runs synchronously on the CPU, so ordering holds trivially; the
objects keep torch_npu's surface (`torch.npu.Stream`, `torch.npu.Event`, `torch.Event` on the accelerator) and count
what was asked of them, so a test can see the device lane synchronise."""

from __future__ import annotations

import collections
import contextlib
import time
from typing import Any

import torch

from ascend_testkit.npu_runtime import graphs

COUNTS: collections.Counter[str] = collections.Counter()


class Stream:
    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device = torch.device("npu", 0) if device is None else torch.device(device)
        self.priority = priority

    def wait_stream(self, stream: Stream) -> None:
        COUNTS["stream.wait_stream"] += 1

    def wait_event(self, event: Event) -> None:
        COUNTS["stream.wait_event"] += 1

    def record_event(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def synchronize(self) -> None:
        graphs.refuse_while_capturing("Stream.synchronize")
        COUNTS["stream.synchronize"] += 1

    def query(self) -> bool:
        return True

    def __enter__(self) -> Stream:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        _CURRENT.pop()


_CURRENT: list[Stream] = []  # [default stream, streams entered...]; made on first use (after `npu` is named)


class Event:
    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 device: Any = None, **kwargs: Any) -> None:
        self.enable_timing = enable_timing
        self.recorded_at: float | None = None

    def record(self, stream: Stream | None = None) -> None:
        COUNTS["event.record"] += 1
        self.recorded_at = time.perf_counter()

    def synchronize(self) -> None:
        graphs.refuse_while_capturing("Event.synchronize")
        COUNTS["event.synchronize"] += 1

    def wait(self, stream: Stream | None = None) -> None:
        COUNTS["event.wait"] += 1

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: Event) -> float:
        if self.recorded_at is None or end.recorded_at is None:
            raise RuntimeError("elapsed_time between events that were not both recorded")
        return (end.recorded_at - self.recorded_at) * 1000.0


def default_stream(device: Any = None) -> Stream:
    if not _CURRENT:
        _CURRENT.append(Stream())
    return _CURRENT[0]


def current_stream(device: Any = None) -> Stream:
    default_stream()
    return _CURRENT[-1]


def set_stream(stream: Stream) -> None:
    default_stream()
    _CURRENT[-1] = stream


@contextlib.contextmanager
def stream(s: Stream | None):
    if s is None:
        yield
        return
    with s:
        yield


def synchronize(device: Any = None) -> None:
    graphs.refuse_while_capturing("torch.npu.synchronize")
    COUNTS["synchronize"] += 1
