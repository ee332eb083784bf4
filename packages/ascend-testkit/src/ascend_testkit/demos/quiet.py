"""Keep a demo's report readable: everything else the process (and vLLM's child processes) print goes to a log file.

vLLM logs to stdout and its children inherit file descriptors 1 and 2, so both are pointed at the log for the demo's
duration; the report goes to a duplicate of the original stdout. When the demo fails, the log's tail is shown.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO


@contextlib.contextmanager
def output_to_log(log_path: str | os.PathLike, *, enabled: bool = True) -> Iterator[TextIO]:
    """Yields the stream to print the report on; with `enabled=False` nothing is redirected (--verbose)."""
    if not enabled:
        yield sys.stdout
        return
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    report = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    with open(log_path, "ab") as log:
        for fd in (1, 2):
            os.dup2(log.fileno(), fd)
    failed = False
    try:
        yield report
    except BaseException:
        failed = True
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, copy in saved.items():
            os.dup2(copy, fd)
            os.close(copy)
        if failed:
            tail = log_path.read_text(errors="replace").splitlines()[-40:]
            print("\n".join(tail) + f"\n(full log: {log_path})", file=sys.stderr)
        report.close()
