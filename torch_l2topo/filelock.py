"""An exclusive advisory file lock (flock) with a timeout.

flock locks are released by the OS when their holder dies, so a killed process never leaves a lock that
blocks everyone after it (unlike a lock *file*, whose mere existence is the lock).
"""
from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path

from .errors import L2TopoError


@contextmanager
def exclusive(path: Path, timeout_s: float, what: str):
    """Hold an exclusive flock on `path` (created if missing); raise L2TopoError after `timeout_s`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise L2TopoError(f"another process has held the {what} lock {path} for over "
                                      f"{timeout_s:.0f} s") from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
