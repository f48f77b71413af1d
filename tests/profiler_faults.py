"""Faults injected into a profiled job (tests/profiler_job.py) and its trace worker processes (fault_worker.py), by
name; the profiler's fault tests (test_profiler_faults.py) run them. Each patches the one call it breaks, the way
the real fault would show there."""
import errno
import os
import time
from pathlib import Path

FAULT_ENV = "L2TOPO_TEST_FAULT"  # the fault a worker process applies too (fault_worker.py)
SLOW_S = 30.0  # a "slow" enrichment: far beyond any test's timeout


class _FullDisk:
    """A file whose writes fail as on a full disk."""

    def __init__(self, fd):
        os.close(fd)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, data):
        raise OSError(errno.ENOSPC, "No space left on device")


def apply_fault(name, in_worker: bool = False) -> None:
    """Patch this process for fault `name` (None: none): "enospc" (the enriched trace's write fails with ENOSPC
    once its temporary file exists) in the job's process and its workers; "slow" and "crash" (a worker process
    dies on its first job) in the workers only; export faults are the job's (export_fault)."""
    from torch_l2topo import files
    from torch_l2topo.profiler.runtime import worker

    if name in (None, "", "none") or name.startswith("export-"):
        return
    if name == "enospc":
        files.os.fdopen = lambda fd, mode="r", *a, **k: _FullDisk(fd)
    elif name == "slow":
        if in_worker:
            real = worker.run
            worker.run = lambda job, timeout_s=None: time.sleep(SLOW_S) or real(job, timeout_s)
    elif name == "crash":
        if in_worker:
            worker.run = lambda job, timeout_s=None: os._exit(3)
    else:
        raise ValueError(f"unknown fault {name!r}")


def export_fault(name, export):
    """torch.profiler's export_chrome_trace for fault `name`: `export(prof, path)` as it is, or broken."""
    if name == "export-missing":  # torch wrote nothing and said nothing
        return lambda prof, path: None
    if name == "export-empty":  # torch's write failed after opening the file (it only logs it)
        return lambda prof, path: Path(path).write_bytes(b"")
    if name == "export-garbage":  # bytes that are no UTF-8 text
        return lambda prof, path: Path(path).write_bytes(b"\xff\xfe\x00garbage\x80")
    if name == "export-truncated-gzip":
        def truncated(prof, path):
            export(prof, path)
            with open(path, "rb+") as f:
                f.truncate(max(os.path.getsize(path) // 2, 10))
        return truncated
    if name == "export-foreign":  # a Chrome trace whose first "traceEvents" key is nested inside another value
        def foreign(prof, path):
            export(prof, path)
            import json

            from torch_l2topo.profiler.trace.tracefile import read_text, write_trace
            trace = json.loads(read_text(path))
            write_trace({"a": {"traceEvents": [{"ph": "i", "name": "nested"}]}, **trace}, path)
        return foreign
    if name == "export-raises":
        def raises(prof, path):
            raise RuntimeError("simulated export failure")
        return raises
    return export
