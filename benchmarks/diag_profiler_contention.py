"""What the trace worker's work costs the profiled steps it runs beside, apart from what the loop itself does
(issue 17: the example model's loop under torch_l2topo.profile, against plain torch.profiler).

Three variants of bench_profiler's profiler blocks (CYCLES cycles of wait 1, warmup 1, 5 active steps each), in
rotating order, many rounds: plain torch.profiler exporting its trace; torch_l2topo.profile as it is (the worker
enriches each cycle's trace while the next cycles run); and the same with the worker held off until the block's
end (no job is handed to it during the loop, so the loop does all its own work and nothing runs beside it; the
block's end then enriches every trace). held against plain: the loop's own costs; background against held:
what the worker's concurrent work costs the loop. Per round: the loop's wall time per cycle and the main
thread's CPU time per cycle (time.thread_time: a slower CPU raises both, waiting raises only the wall time), and
the machine's steal time (a virtual machine's CPU taken by its host).

    python benchmarks/diag_profiler_contention.py --device 0 \
        --out benchmarks/results/diagnosis/profiler_contention_h200.json
"""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from bench_profiler import CAPACITY, _loop, model_step
from common import calibrated_device, gpu_parser, quantiles, write_result

from torch_l2topo.profiler import session, worker


def steal_ticks() -> int:
    """The machine's steal time so far, in clock ticks (/proc/stat; 0 where there is none)."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()
        return int(fields[8]) if len(fields) > 8 else 0
    except OSError:
        return 0


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=24)
    parser.add_argument("--cycles", type=int, default=8)
    args = parser.parse_args(argv)
    dev, _, _ = calibrated_device(args.device, "profiler")
    step, which = model_step(dev)
    work = Path(tempfile.mkdtemp(prefix="l2topo-diag-contention-"))
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    held = {"on": False}
    hand_over = worker.Worker._hand_over

    def held_hand_over(self):
        if not held["on"]:
            hand_over(self)

    def plain(sched):
        n = [0]

        def export(p):
            n[0] += 1
            p.export_chrome_trace(str(work / f"plain-{n[0]}.json"))

        return torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=export)

    def ours(sched):
        return session.profile(work / "ours", activities=acts, schedule=sched, devices=[dev.index],
                               capacity=CAPACITY)

    class Held(session.profile):
        """torch_l2topo.profile whose jobs stay with this process until stop() (the block's end)."""

        def stop(self):
            held["on"] = False
            super().stop()

    def ours_held(sched):
        held["on"] = True
        return Held(work / "held", activities=acts, schedule=sched, devices=[dev.index], capacity=CAPACITY)

    variants = {"plain": plain, "background": ours, "background_held": ours_held}
    wall = {k: [] for k in variants}
    cpu = {k: [] for k in variants}
    steal = {k: [] for k in variants}
    exit_s = {k: [] for k in variants}
    worker.Worker._hand_over = held_hand_over
    try:
        with torch.no_grad():
            for make in variants.values():  # warm: compilation, first exports, the worker's imports, the slots
                _loop(step, make, args.cycles, [], [])
            names = list(variants)
            for r in range(args.reps):
                for name in names[r % len(names):] + names[:r % len(names)]:
                    s0, loop_cpu = steal_ticks(), []
                    loop_s, end_s = _loop(step, variants[name], args.cycles, [], [], loop_cpu)
                    cpu[name].append(loop_cpu[0] / args.cycles)
                    steal[name].append(steal_ticks() - s0)
                    wall[name].append(loop_s / args.cycles)
                    exit_s[name].append(end_s)
                print(f"round {r + 1}/{args.reps}: " + ", ".join(f"{k} {wall[k][-1] * 1e3:.2f} ms" for k in names),
                      flush=True)
    finally:
        worker.Worker._hand_over = hand_over

    def ratio(a, b):
        return {"of_medians": float(np.median(wall[a]) / np.median(wall[b])),
                "paired": quantiles(np.asarray(wall[a]) / np.asarray(wall[b]))}

    figures = {"model": which, "cycles_per_block": args.cycles, "rounds": args.reps,
               "loop_s_per_cycle": {k: quantiles(v) for k, v in wall.items()},
               "loop_s_per_cycle_by_round": wall,
               "loop_thread_cpu_s_per_cycle": {k: quantiles(v) for k, v in cpu.items()},
               "exit_s": {k: quantiles(v) for k, v in exit_s.items()},
               "steal_ticks_per_block": {k: quantiles(v) for k, v in steal.items()},
               "held_over_plain": ratio("background_held", "plain"),
               "background_over_held": ratio("background", "background_held"),
               "background_over_plain": ratio("background", "plain")}
    print({k: figures[k] for k in ("held_over_plain", "background_over_held", "background_over_plain")}, flush=True)
    path = write_result(args.out, figures, args.device)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
