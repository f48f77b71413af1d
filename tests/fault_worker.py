"""A trace worker process with the fault named in its environment applied first (profiler_faults.py); the fault
tests start it in place of `python -m torch_l2topo.profiler.runtime.worker` (worker.COMMAND)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiler_faults import FAULT_ENV, apply_fault  # noqa: E402

from torch_l2topo.profiler.runtime.worker import main

if __name__ == "__main__":
    apply_fault(os.environ.get(FAULT_ENV), in_worker=True)
    main()
