"""The per-allocation cache of partition maps: one map per tensor storage and block size, for as long as the
storage lives where it was mapped.

Homes follow physical addresses, fixed for an allocation's lifetime, so a map stays right until its storage
is freed or moves. untyped_storage() returns one Python object per storage for as long as any tensor uses it
(torch keeps the storage's Python object alive with it; tests/test_partition_map.py checks this), so a
weakref.finalize on it runs when the allocation is freed and drops the map. The key (device, address, size,
block size) also catches a storage that was resized in place, and the weak reference kept with each map a
new storage at a recycled address.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass


def storage_key(storage, device, block_bytes: int) -> tuple:
    """Where a storage's map is kept: (device, address, size in bytes, block size)."""
    return (str(device), storage.data_ptr(), storage.nbytes(), int(block_bytes))


@dataclass
class _Entry:
    storage: weakref.ref
    block_bytes: int
    value: object
    finalizer: weakref.finalize


class MapCache:
    """Values (partition maps) kept per tensor storage and block size. key(storage, device, block_bytes) says
    where a storage's value is kept (default storage_key); a value is served only to the storage it was made
    for, and dropped when that storage is freed."""

    def __init__(self, key=storage_key):
        self._key = key
        self._entries: dict[tuple, _Entry] = {}

    def get(self, tensor, block_bytes: int):
        """The value kept for the tensor's storage (any view of it) and block size, or None."""
        storage = tensor.untyped_storage()
        entry = self._entries.get(self._key(storage, tensor.device, block_bytes))
        return entry.value if entry is not None and entry.storage() is storage else None

    def put(self, tensor, block_bytes: int, value) -> None:
        """Keep `value` for the tensor's storage and block size, replacing what was kept for the storage at an
        older address or size."""
        storage = tensor.untyped_storage()
        stale = [k for k, e in self._entries.items() if e.storage() is storage and e.block_bytes == block_bytes]
        key = self._key(storage, tensor.device, block_bytes)
        for k in [*stale, key]:
            self._drop(k)
        self._entries[key] = _Entry(weakref.ref(storage), int(block_bytes), value,
                                    weakref.finalize(storage, self._forget, key, id(value)))

    def clear(self) -> None:
        for key in list(self._entries):
            self._drop(key)

    def __len__(self) -> int:
        return len(self._entries)

    def _forget(self, key: tuple, value_id: int) -> None:
        entry = self._entries.get(key)
        if entry is not None and id(entry.value) == value_id:
            del self._entries[key]

    def _drop(self, key: tuple) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            entry.finalizer.detach()
