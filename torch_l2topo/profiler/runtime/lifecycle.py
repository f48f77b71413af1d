"""What the profiler leaves when its process ends: nothing of its own in /dev/shm or beside the traces.

install_signal_handlers(): SIGTERM and SIGINT go first to whatever handled them before; where that is the
default action (the process ends without running atexit), the trace worker processes are killed, their temporary
files and the record slots' files removed, and the signal is then delivered again with its default action. The
plain traces are on disk already (each at its cycle's end), so what plain torch.profiler would have written is
there. remove_stale(): what a process killed outright (SIGKILL) left: record slots and temporary trace files of
processes that no longer exist. docs/profiler.md, Safety.
"""
from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
from contextlib import suppress

from ...files import left_behind, stale_temp_files
from .spool import SLOT_PREFIX, existing_spool, shm_directory
from .worker import existing_worker

SIGNALS = (signal.SIGTERM, signal.SIGINT)
_SLOT_NAME = re.compile(re.escape(SLOT_PREFIX) + r"([0-9a-f]{8})-(\d+)-")
_previous: dict = {}  # signal -> the handler ours replaced


def install_signal_handlers() -> None:
    """Put ours in front of the current SIGTERM and SIGINT handlers (once; only the main thread may)."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in SIGNALS:
        current = signal.getsignal(sig)
        if current is _on_signal or current is None:  # ours already, or one set outside Python: left alone
            continue
        _previous[sig] = current
        signal.signal(sig, _on_signal)


def _on_signal(signum, frame) -> None:
    previous = _previous.get(signum, signal.SIG_DFL)
    if callable(previous):  # Python's SIGINT handler raises KeyboardInterrupt: the process unwinds and atexit runs
        previous(signum, frame)
        return
    if previous == signal.SIG_IGN:
        return
    clean_up_now()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def clean_up_now() -> None:
    """Kill the worker processes (their temporary files removed) and remove the record slots' files; no CUDA call
    and no wait: the process is about to end."""
    worker, spool = existing_worker(), existing_spool()
    if worker is not None:
        worker.abandon()
    if spool is not None:
        spool.remove_files()


def remove_stale(*trace_directories) -> None:
    """Remove what processes that no longer exist left: record slots (in /dev/shm and the temporary directory) and
    temporary trace files in `trace_directories`."""
    for directory in {shm_directory(), tempfile.gettempdir()} - {None}:
        with suppress(OSError):
            for name in os.listdir(directory):
                m = _SLOT_NAME.match(name)
                if m and left_behind(m[1], int(m[2])):
                    with suppress(OSError):
                        os.unlink(os.path.join(directory, name))
    for directory in trace_directories:
        for path in stale_temp_files(directory):
            with suppress(OSError):
                path.unlink()
