"""An engine host process: JSON-line commands on stdin, one JSON-line reply each on the original stdout.

Command: `{"op": "<EngineSession method>", ...keyword arguments}`; reply: `{"ok": true, "result": ...}` or
`{"ok": false, "error": {"type", "message", "traceback"}}` (a failed command, such as a start-up refused for a bad
config, leaves the host ready for the next one). While the engine has work and no command is waiting, the host
steps it, as vLLM's busy loop would, so held or in-flight KV transfers progress between commands. `exit` ends the
process after stopping the engine. vLLM's logs (some go to stdout) are sent to stderr, the host's log file.

    python -m ascend_testkit.engine.host [--setup module:function]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import sys
import traceback
from typing import Any, NoReturn

IDLE_POLL_S = 0.5


def _rpc_stream():
    fd = os.dup(1)
    os.dup2(2, 1)  # anything printed to stdout (vLLM logs there) lands in the log instead of the reply pipe
    sys.stdout = sys.stderr
    return os.fdopen(fd, "w", buffering=1)


def _error(exc: BaseException) -> dict[str, Any]:
    return {"type": type(exc).__name__, "message": str(exc), "traceback": traceback.format_exc()[-4000:]}


class CommandReader:
    """Lines from a pipe without Python's buffering, so `select` never misses a command already read."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""
        self.eof = False

    def ready(self, timeout: float) -> bool:
        if b"\n" in self.buffer or self.eof:
            return True
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if readable:
            chunk = os.read(self.fd, 1 << 16)
            self.buffer += chunk
            self.eof = not chunk
        return b"\n" in self.buffer or self.eof

    def line(self) -> str | None:
        if b"\n" not in self.buffer:
            return None
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line.decode()


def serve(out, stdin_fd: int = 0) -> None:
    from ascend_testkit.engine.session import EngineSession

    reader = CommandReader(stdin_fd)
    session = EngineSession()
    out.write(json.dumps({"ok": True, "result": {"hello": True, "pid": os.getpid()}}) + "\n")
    while True:
        busy = session.busy()
        if not reader.ready(0 if busy else IDLE_POLL_S):
            if busy:
                session.step()
            continue
        line = reader.line()
        if line is None:  # end of input: the client is gone
            session.stop()
            break
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            session.stop()
            out.write(json.dumps({"ok": True, "result": None}) + "\n")
            break
        try:
            if op.startswith("_") or not callable(getattr(session, op, None)):
                raise AttributeError(f"unknown engine host command {op!r}")
            reply = {"ok": True, "result": getattr(session, op)(**cmd)}
        except Exception as exc:
            reply = {"ok": False, "error": _error(exc)}
        out.write(json.dumps(reply, default=str) + "\n")


def main(argv: list[str] | None = None) -> NoReturn:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="append", default=[],
                        help="module:function called before anything else (e.g. a benchmark's shim)")
    args = parser.parse_args(argv)
    out = _rpc_stream()
    from ascend_testkit.engine.session import _resolve

    for setup in args.setup:
        _resolve(setup)()
    serve(out)
    # A thread a connector left running (Mooncake's, a transfer pool's) would hold interpreter shutdown until the
    # client kills the process, losing what it recorded (coverage saves at exit): end the process here.
    out.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
