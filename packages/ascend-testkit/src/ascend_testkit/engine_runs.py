"""Engine runs shared by the tests of a suite: `runs[key]` runs `_run(*key)` once and keeps what it returned, or the
exception it raised, which every later test of that key then raises too (no test starts a failed engine again)."""

from __future__ import annotations

from typing import Any


class EngineRuns:
    def __init__(self) -> None:
        self.results: dict[tuple, Any] = {}

    def _run(self, *key: Any) -> Any:
        raise NotImplementedError

    def __getitem__(self, key: tuple) -> Any:
        if key not in self.results:
            try:
                self.results[key] = self._run(*key)
            except Exception as exc:  # every test of this engine fails with it; none starts it again
                self.results[key] = exc
        result = self.results[key]
        if isinstance(result, Exception):
            raise result
        return result
