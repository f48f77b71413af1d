"""Safe file operations: an exclusive advisory lock with a timeout, atomic writes, JSON of numpy values, and reading
a JSON file with one-line errors that name it.

flock locks are released by the OS when their holder dies, so a killed process never leaves a lock that
blocks everyone after it (unlike a lock *file*, whose mere existence is the lock). Atomic writes go to a
temporary file in the target's directory and are renamed over it, so readers never see half a file; the file
gets the mode a plain open() would give it (0666 less the umask), and the temporary file's name carries its
writer's process id, so that what a killed writer left can be told apart and removed (stale_temp_files).
"""
from __future__ import annotations

import fcntl
import functools
import glob
import hashlib
import json
import os
import re
import socket
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


TEMP_SUFFIX = ".l2topo-tmp"
_TEMP_NAME = re.compile(r"^\..*\.([0-9a-f]{8})-(\d+)-[^.]+" + re.escape(TEMP_SUFFIX) + "$")


@functools.lru_cache(maxsize=None)
def host_tag() -> str:
    """8 hex digits naming this host and pid namespace: a process id in a file name is only compared with those
    of its own host and namespace (trace directories on shared filesystems, containers sharing /dev/shm)."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        namespace = 0
    return hashlib.sha1(f"{socket.gethostname()}:{namespace}".encode()).hexdigest()[:8]


def owner_tag() -> str:
    """<host_tag>-<pid>: what names this process in the files it may leave behind (stale_temp_files)."""
    return f"{host_tag()}-{os.getpid()}"


def left_behind(tag: str, pid: int) -> bool:
    """Whether a file named by owner_tag() (tag, pid) belongs to a process of this host that no longer exists."""
    return tag == host_tag() and not pid_alive(pid)


def umask() -> int:
    """This process's umask, read without changing it where Linux tells it (/proc/self/status)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere: set and restore (not atomic, hence the first way)
    os.umask(mask)
    return mask


def atomic_write(path: Path, data: bytes, durable: bool = True) -> Path:
    """Write `data` to `path` atomically (temp file in the same directory, fsync unless not durable, rename):
    a reader sees the old file or the whole new one, with the mode open() would give it. durable=False skips
    the fsync: the file may then be lost (not torn) if the machine goes down soon after."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{owner_tag()}-", suffix=TEMP_SUFFIX, dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~umask())  # mkstemp makes it 0600
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


def temp_files_of(path, pid: int) -> list:
    """The temporary files that process `pid` left while writing `path` atomically (a writer killed mid-way)."""
    path = Path(path)
    return sorted(path.parent.glob(f".{glob.escape(path.name)}.{host_tag()}-{pid}-*{TEMP_SUFFIX}"))


def stale_temp_files(directory) -> list:
    """Temporary files of atomic writes in `directory` whose writer process no longer exists."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [Path(directory) / n for n in names if (m := _TEMP_NAME.match(n)) and left_behind(m[1], int(m[2]))]


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (in this pid namespace); one of another user counts as existing."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
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
