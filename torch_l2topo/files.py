"""Safe file operations: an exclusive advisory lock with a timeout, atomic writes, JSON of numpy values, and reading
a JSON file with one-line errors that name it.

flock locks are released by the OS when their holder dies, so a killed process never leaves a lock that
blocks everyone after it (unlike a lock *file*, whose mere existence is the lock). Atomic writes go to a
temporary file in the target's directory and are renamed over it, so readers never see half a file.
"""
from __future__ import annotations

import fcntl
import json
import os
import tempfile
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


def atomic_write(path: Path, data: bytes, durable: bool = True) -> Path:
    """Write `data` to `path` atomically (temp file in the same directory, fsync unless not durable, rename):
    a reader sees the old file or the whole new one. durable=False skips the fsync: the file may then be lost
    (not torn) if the machine goes down soon after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


_JSON_TYPES = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "a boolean",
               type(None): "null"}


def read_json(path, error: type, what: str) -> dict:
    """The JSON object in the file at `path`; `error` (an L2TopoError class) naming the file when it is empty, not
    UTF-8, not JSON, or not an object at its top level (`what`: what it should be, for the message). A missing or
    unreadable file raises OSError, as open() does."""
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path} is not {what}: not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        raise error(f"{path} is not {what}: the file is empty")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path} is not {what}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") \
            from None
    if not isinstance(doc, dict):
        raise error(f"{path} is not {what}: its JSON is {_JSON_TYPES.get(type(doc), type(doc).__name__)}, not an "
                    "object")
    return doc


def json_default(x):
    """json.dump's default= for results holding numpy values: scalars become Python numbers, arrays lists."""
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")
