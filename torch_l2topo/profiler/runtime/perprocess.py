"""One object per process for the profiler's process-wide resources (the record spool, the trace worker), made on
first use. A process forked from ours (a data loader's worker, say) inherits the parent's objects but gets its own
on first use, and closing at exit closes only its own: never the parent's slots, nor the parent's worker (whose
answers it would otherwise read from the shared pipe)."""
from __future__ import annotations

import os
from typing import Callable

# this process's id, kept at hand: os.getpid() is a system call (0.7 us in the trace handler on the development
# machine, where each line costs about three times as much at a cycle's edge); a forked child updates it
_pid = [os.getpid()]
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _pid.__setitem__(0, os.getpid()))


def this_pid() -> int:
    """This process's id (os.getpid(), without the system call)."""
    return _pid[0]


class PerProcess:
    """get(): this process's object, made by make() on first use; existing(): it or None; close(*args): close it
    (if made) and forget it."""

    def __init__(self, make: Callable):
        self._make = make
        self._objects: dict = {}  # pid -> object

    def get(self):
        pid = this_pid()
        obj = self._objects.get(pid)
        if obj is None:
            obj = self._objects[pid] = self._make()
        return obj

    def existing(self):
        """This process's object if it was made, else None (nothing is made)."""
        return self._objects.get(this_pid())

    def close(self, *args) -> None:
        """Close this process's object (if made) with `args`, and forget it."""
        obj = self._objects.pop(this_pid(), None)
        if obj is not None:
            obj.close(*args)
