"""Helpers of the profiler's CPU tests: a few profiled steps of a small CPU model, its exported trace, and a
trace worker that has finished its imports."""
import time
from pathlib import Path

import torch

from torch_l2topo.profiler.runtime.worker import Worker

ACTIVITIES = [torch.profiler.ProfilerActivity.CPU]


def steps(prof, n: int) -> None:
    model = torch.nn.Linear(16, 16)
    for _ in range(n):
        model(torch.randn(8, 16)).sum()
        prof.step()


def export(tmp_path, name: str = "export.json") -> Path:
    """A real torch.profiler trace of one step, exported to tmp_path / name."""
    with torch.profiler.profile(activities=ACTIVITIES) as prof:
        steps(prof, 1)
    prof.export_chrome_trace(str(tmp_path / name))
    return tmp_path / name


def ready_worker(**options) -> Worker:
    """A Worker whose process has said READY (its imports take seconds)."""
    worker = Worker(**options)
    worker.start()
    deadline = time.monotonic() + 120
    while not worker.ready():
        assert time.monotonic() < deadline, "the worker did not start"
        time.sleep(0.05)
    return worker
