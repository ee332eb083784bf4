"""The scheduler's index of the host tier: block hash -> slot, least recently used first out, bounded by bytes.

The scheduler owns placement (the worker only copies to and from the slots it is told), so it can answer prefix
lookups without asking the worker. A slot being loaded this step is pinned and never handed to a store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence


class HostTierIndex:
    def __init__(self, budget_bytes: int, bytes_per_block: int):
        if bytes_per_block <= 0:
            raise ValueError(f"bytes_per_block={bytes_per_block}")
        self.num_slots = budget_bytes // bytes_per_block
        if self.num_slots < 1:
            raise ValueError(f"host tier budget of {budget_bytes} B holds no block of {bytes_per_block} B; "
                             "raise kv_connector_extra_config['host_bytes']")
        self.bytes_per_block = bytes_per_block
        self._slots: OrderedDict[Hashable, int] = OrderedDict()
        self._free = list(range(self.num_slots - 1, -1, -1))
        self._pins: dict[int, int] = {}
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._slots

    @property
    def used_bytes(self) -> int:
        return len(self._slots) * self.bytes_per_block

    def lookup_prefix(self, keys: Sequence[Hashable]) -> int:
        """How many leading `keys` are in the tier (no recency update: lookups may be repeated)."""
        n = 0
        for key in keys:
            if key not in self._slots:
                break
            n += 1
        return n

    def slots_for(self, keys: Sequence[Hashable]) -> list[int]:
        """Slots of `keys` (all present), marked most recently used."""
        slots = []
        for key in keys:
            self._slots.move_to_end(key)
            slots.append(self._slots[key])
        return slots

    def pin(self, slots: Sequence[int]) -> None:
        for s in slots:
            self._pins[s] = self._pins.get(s, 0) + 1

    def unpin(self, slots: Sequence[int]) -> None:
        for s in slots:
            left = self._pins.get(s, 0) - 1
            if left > 0:
                self._pins[s] = left
            else:
                self._pins.pop(s, None)

    def allocate(self, key: Hashable) -> int | None:
        """A slot for a new `key`, evicting the least recently used unpinned entry if full; None if all pinned."""
        if key in self._slots:
            raise KeyError(f"{key!r} already in the host tier")
        if not self._free:
            victim = next((k for k, s in self._slots.items() if s not in self._pins), None)
            if victim is None:
                return None
            self._free.append(self._slots.pop(victim))
            self.evictions += 1
        slot = self._free.pop()
        self._slots[key] = slot
        return slot
