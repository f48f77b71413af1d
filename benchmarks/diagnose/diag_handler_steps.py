"""Where a profiled cycle's trace handler spends its time, step by step, against plain torch.profiler's export:
the example model under torch_l2topo.profile (background, the default), TraceHandler.__call__ and its steps timed
(records taken, the export, its size read, the job handed over), with the traces in a temporary directory and,
in blocks of their own, in /dev/shm (memory); plain torch.profiler exports to the same places.

    python benchmarks/diagnose/diag_handler_steps.py --device 0 --out FILE
"""
from __future__ import annotations

import shutil
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from common import calibrated_device, gpu_parser, write_result  # noqa: E402
from profiler_cycles import ACTIVE, CAPACITY, model_step  # noqa: E402

from torch_l2topo.measure import recording  # noqa: E402
from torch_l2topo.profiler import session  # noqa: E402
from torch_l2topo.profiler.runtime import worker  # noqa: E402


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=4)
    parser.add_argument("--cycles", type=int, default=8)
    args = parser.parse_args(argv)
    dev, _, ident = calibrated_device(args.device, "handler-steps")
    recording.recorder(dev.index, session.held_capacity(CAPACITY))
    step, which = model_step(dev)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=args.cycles)
    times = defaultdict(list)
    place = {"now": ""}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            out = fn(*a, **k)
            times[f"{place['now']} {name}"].append(time.perf_counter() - t)
            return out
        return wrapper

    session.TraceHandler.__call__ = timed("ours: handler", session.TraceHandler.__call__)
    session.TraceHandler._take_records = timed("ours: records", session.TraceHandler._take_records)
    session.os.path.getsize = timed("ours: getsize", session.os.path.getsize)
    worker.Worker.submit = timed("ours: submit", worker.Worker.submit)
    roots = {"tmp": Path(tempfile.mkdtemp(prefix="l2topo-handler-steps-")),
             "shm": Path(tempfile.mkdtemp(prefix="l2topo-handler-steps-", dir="/dev/shm"))}
    export = timed("plain: export", lambda p, path: p.export_chrome_trace(path))
    with torch.no_grad():
        for r in range(args.reps + 1):
            for name, root in roots.items():
                place["now"] = name
                n = [0]

                def plain(p, root=root, n=n):
                    n[0] += 1
                    export(p, str(root / f"plain-{n[0]}.json"))

                for make in (lambda: torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=plain),
                             lambda: session.profile(root / "ours", activities=acts, schedule=sched,
                                                     devices=[dev.index], capacity=CAPACITY)):
                    with make() as prof:
                        for _ in range((2 + ACTIVE) * args.cycles):
                            step()
                            prof.step()
            if r == 0:  # warm: compilation, the workers' imports
                times.clear()
    figures = {"model": which, "calibration": ident,
               "ms": {k: {**{q: float(np.percentile(x, p)) * 1e3 for q, p in (("p20", 20), ("p50", 50), ("p80", 80))},
                          "n": len(x)} for k, x in sorted(times.items())}}
    for k, v in figures["ms"].items():
        print(f"{k:22s} p50 {v['p50']:.3f} ms  p20 {v['p20']:.3f}  p80 {v['p80']:.3f}  n {v['n']}", flush=True)
    for root in roots.values():
        shutil.rmtree(root, ignore_errors=True)
    write_result(args.out, figures, args.device)
    return figures


if __name__ == "__main__":
    main()
