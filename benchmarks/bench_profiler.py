"""What the profiler costs and whether its timelines are right (docs/profiler.md, Costs).

1. Compiled out: with recording off, the recorder's demo kernel compiles to the same PTX as the kernel written
   without the recorder and takes the same time (CUDA events around eager launches queued behind a GPU spin);
   with recording on it is timed beside them.
2. Overhead against plain torch.profiler exporting the same traces, on the example model
   (profiler_cycles.model_step) and, with --heavy-ms, on a step with ~100 ms of matmuls added: blocks of --cycles
   cycles under plain, torch_l2topo.profile (the default: enrichment in the workers once the steps are over),
   max_held=0 ("concurrent": beside the steps) and background=False ("inline"), in rotating order. Targets: the
   profiled steps' wall time per cycle within 2% of plain's (loop_overhead); the block's end waits at most plain's
   own export of the same cycles plus 0.5 s (end_wait). Read cycle against adjacent plain cycles too
   (--adjacent-blocks; profiler_cycles.ours_against_plain), where the machine's drift cancels.
3. What the records' hand-off mechanisms earn (mechanisms): held drains against a drain every cycle, and the
   drain as one CUDA graph against its operations one by one, in the adjacent design.
4. Coverage: in the last enriched trace every CTA of every instrumented launch appears once, on an SM of the GPU,
   inside its kernel's event; and HolisticTraceAnalysis (where importable) reads the same kernel breakdown.

    python benchmarks/bench_profiler.py --device 0
"""
from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from bench_placement import interleaved
from common import bootstrap_ci90, calibrated_device, gpu_parser, quantile_rows, quantiles, row, write_result
from profiler_cycles import ACTIVE, CAPACITY, DIM, GRID, ROWS, model_step, ours_against_plain

from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.demo import ptx_instructions
from torch_l2topo.profiler.runtime import spool
from torch_l2topo.profiler.trace.align import TICK_NS
from torch_l2topo.profiler.trace.readback import launches
from torch_l2topo.profiler.trace.tracefile import load_trace, strip, write_trace
from torch_l2topo.profiler.trace.tracks import CTA_CATEGORY

ADJACENT_CYCLES = 100  # per block of the adjacent-cycle comparison
VARIANTS = ("plain", "background", "concurrent", "inline")  # overhead(): plain torch.profiler, then ours


def compiled_out(dev, reps: int) -> dict:
    from torch_l2topo.triton_kernels.recorder_demo import row_sum_kernel, row_sum_plain_kernel

    x = torch.randn(ROWS, DIM, device=dev)
    out = torch.empty(ROWS, device=dev)
    cls = torch.zeros(ROWS, dtype=torch.int32, device=dev)
    n_sm = torch.cuda.get_device_properties(dev).multi_processor_count
    part = torch.zeros(n_sm, dtype=torch.int32, device=dev)
    rec = recording.recorder(dev.index)
    tag = rec.register("row_sum_kernel")

    def launch(kernel, record):
        return kernel[(GRID,)](x, out, ROWS, DIM, cls, part, rec.buffer, tag, RECORD=record, BLOCK=DIM)

    off, plain = launch(row_sum_kernel, False), launch(row_sum_plain_kernel, False)
    same = ptx_instructions(off.asm["ptx"], "row_sum_kernel") == ptx_instructions(plain.asm["ptx"],
                                                                                  "row_sum_plain_kernel")
    times = interleaved({"plain_kernel": lambda: launch(row_sum_plain_kernel, False),
                         "record_off": lambda: launch(row_sum_kernel, False),
                         "record_on": lambda: launch(row_sum_kernel, True)}, reps * 40, spin=True)
    rec.drain()
    return {"ptx_equal_to_plain_kernel": same, "ms": times,
            "record_off_over_plain": times["record_off"]["p50"] / times["plain_kernel"]["p50"],
            "record_on_over_plain": times["record_on"]["p50"] / times["plain_kernel"]["p50"],
            "grid": GRID, "rows": ROWS}


def _loop(step, make_profiler, cycles: int, gpu_ms: list, later_cycles: list, loop_cpu: list | None = None) -> tuple:
    """(loop seconds, exit seconds) of `cycles` profiled cycles in one profiler block (each: wait 1, warmup 1,
    ACTIVE active steps, then its trace handler); the loop ends after the last step, the exit is the block's
    end (for torch_l2topo.profile: waiting for the traces still in the worker). Appends each cycle's active
    steps' CUDA-event ms to gpu_ms, the wall seconds of every cycle after the first (the steady state of a long
    run: the worker has started) to later_cycles, and the loop's main-thread CPU seconds to loop_cpu."""
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=cycles)
    events, starts = [], []
    torch.cuda.synchronize()
    t0, c0 = time.perf_counter(), time.thread_time()
    with make_profiler(sched) as prof:
        for c in range(cycles):
            starts.append(time.perf_counter())
            for i in range(2 + ACTIVE):
                if i == 2:
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record()
                step()
                if i == 1 + ACTIVE:
                    events.append(torch.cuda.Event(enable_timing=True))
                    events[-1].record()
                prof.step()
        t_loop, c_loop = time.perf_counter(), time.thread_time()
    t_exit = time.perf_counter()
    torch.cuda.synchronize()
    gpu_ms += [a.elapsed_time(b) for a, b in zip(events[::2], events[1::2])]
    later_cycles += np.diff(starts[1:] + [t_loop]).tolist()
    if loop_cpu is not None:
        loop_cpu.append(c_loop - c0)
    return t_loop - t0, t_exit - t_loop


def heavy_step(step, dev, extra_ms: float):
    """`step` followed by bf16 matmuls of about extra_ms on this GPU: a larger model's step around the same
    instrumented op (same CTAs per step, more uninstrumented work)."""
    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()
    n = max(1, round(extra_ms / ((time.perf_counter() - t) / 10 * 1000)))

    def step2():
        out = step()
        for _ in range(n):
            a @ a
        return out

    return step2


def overhead(dev, reps: int, work: Path, cycles: int, step, which: str, inline_reps: int) -> tuple:
    """Per-cycle wall time of `cycles` cycles in one block, under torch.profiler.profile exporting its trace
    (what a user runs instead), torch_l2topo.profile (background worker after the steps, the default; and
    beside them, "concurrent") and torch_l2topo.profile(background=False) (in the first inline_reps rounds
    only: its blocks take seconds); rounds in rotating order. Also the enrichment's own time per trace
    (cycle.run, timed inline)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    post = []
    original = session.run

    def timed_run(job):
        t = time.perf_counter()
        out = original(job)
        post.append(time.perf_counter() - t)
        return out

    handler_s = {k: [] for k in VARIANTS}
    original_call = session.TraceHandler.__call__

    def timed_call(self, prof):  # each variant writes to work / its name
        t = time.perf_counter()
        original_call(self, prof)
        handler_s[os.path.basename(self.directory)].append(time.perf_counter() - t)

    written = []
    work.mkdir(parents=True, exist_ok=True)

    def plain(sched):
        def export(p):
            path = work / f"plain-{len(written)}.json"
            written.append(path)
            t = time.perf_counter()
            p.export_chrome_trace(str(path))
            handler_s["plain"].append(time.perf_counter() - t)

        return torch.profiler.profile(activities=acts, schedule=sched, on_trace_ready=export)

    def ours(name, **options):
        return lambda sched: session.profile(work / name, activities=acts, schedule=sched, devices=[dev.index],
                                             capacity=CAPACITY, **options)

    variants = {"plain": plain, "background": ours("background"), "concurrent": ours("concurrent", max_held=0),
                "inline": ours("inline", background=False)}
    assert tuple(variants) == VARIANTS
    loop = {k: [] for k in variants}
    later = {k: [] for k in variants}
    exit_s = {k: [] for k in variants}
    gpu = {k: [] for k in variants}
    session.run, session.TraceHandler.__call__ = timed_run, timed_call
    try:
        with torch.no_grad():
            for name, make in variants.items():  # warm: compile, first exports, worker imports, spool slots
                _loop(step, make, cycles, [], [])
            post.clear()
            for v in handler_s.values():
                v.clear()
            for r in range(reps):
                names = [n for n in variants if n != "inline" or r < inline_reps]  # inline: its first rounds only
                for name in names[r % len(names):] + names[:r % len(names)]:
                    a, b = _loop(step, variants[name], cycles, gpu[name], later[name])
                    loop[name].append(a / cycles)
                    exit_s[name].append(b)
    finally:
        session.run, session.TraceHandler.__call__ = original, original_call
    per_cycle = {k: [(a * cycles + b) / cycles for a, b in zip(loop[k], exit_s[k])] for k in variants}
    med = {k: float(np.median(v)) for k, v in per_cycle.items()}
    loop_med = {k: float(np.median(v)) for k, v in loop.items()}
    profiled = VARIANTS[1:]
    paired = {k: [a / b for a, b in zip(loop[k], loop["plain"])] for k in profiled}
    figures = {"model": which, "active_steps": ACTIVE, "cycles_per_block": cycles,
               "cycle_wall_s": {k: quantiles(v) for k, v in per_cycle.items()},
               "loop_s_per_cycle": {k: quantiles(v) for k, v in loop.items()},
               # every round's value, in round order (variants rotate: round r starts with its r % n-th variant): a
               # machine whose rounds fall into modes shows here what quantiles hide
               "loop_s_per_cycle_by_round": loop,
               "exit_s": {k: quantiles(v) for k, v in exit_s.items()},
               "later_cycle_s": {k: quantiles(v) for k, v in later.items()},
               "later_cycle_overhead": {k: float(np.median(later[k]) / np.median(later["plain"]) - 1)
                                        for k in profiled},
               "active_gpu_ms": {k: quantiles(v) for k, v in gpu.items()},
               "post_processing_s": quantiles(post),
               "handler_s": {k: quantiles(v) for k, v in handler_s.items()},
               "loop_overhead": {k: loop_med[k] / loop_med["plain"] - 1 for k in profiled},
               "loop_overhead_ci90": {k: overhead_ci90(loop[k], loop["plain"]) for k in ("background", "concurrent")},
               "loop_ratio_paired": {k: quantiles(v) for k, v in paired.items()},
               "cycle_overhead": {k: med[k] / med["plain"] - 1 for k in profiled},
               "active_gpu_overhead": {k: float(np.median(gpu[k]) / np.median(gpu["plain"]) - 1)
                                       for k in ("background", "concurrent")},
               "target": "loop_overhead['background'] <= 0.02: the profiled steps' wall time per cycle, trace "
                         "handler included, against plain torch.profiler exporting its trace; the enrichment "
                         "runs in the worker (post_processing_s) once the steps are over and the block's end "
                         "waits for it (exit_s, cycle_overhead); 'concurrent': the worker enriches beside the "
                         "steps (max_held=0), as a block does beyond its first max_held cycles",
               "target_loop_overhead": 0.02}
    figures["meets_target"] = figures["loop_overhead"]["background"] <= figures["target_loop_overhead"]
    figures["end_wait"] = end_wait(exit_s, handler_s, cycles)
    last = sorted((work / "background").glob("*.json"), key=lambda p: p.stat().st_mtime)[-1]
    figures["bound"] = write_bound(last, work, med["plain"])
    return figures, last


END_WAIT_ALLOWANCE_S = 0.5  # the block's end may wait this much longer than plain torch.profiler's exports


def end_wait(exit_s: dict, handler_s: dict, cycles: int) -> dict:
    """How long a block's end waits with the enrichment in the workers (the default), against the target: plain
    torch.profiler's own export of the same cycles (its handler's median time, `cycles` times) plus its block's
    end, plus END_WAIT_ALLOWANCE_S."""
    plain_exports_s = cycles * float(np.median(handler_s["plain"]))
    allowed = float(np.median(exit_s["plain"])) + plain_exports_s + END_WAIT_ALLOWANCE_S
    ours = float(np.median(exit_s["background"]))
    return {"background_s": ours, "plain_exports_s": plain_exports_s, "allowed_s": allowed,
            "meets_target": ours <= allowed}


class drains_without_graphs:
    """Within it, the spool drains with its operations one by one instead of one captured CUDA graph (what the
    graph earns is measured against this); the graphs already captured come back on exit."""

    def __enter__(self):
        self.capture, self.kept = spool._capture, {}
        spool._capture = lambda ops, device: None
        for slot in spool.shared_spool()._slots:
            self.kept[slot] = (slot.graph, slot._graph_of)
            slot.graph = None
        return self

    def __exit__(self, *exc):
        spool._capture = self.capture
        for slot, (graph, of) in self.kept.items():
            slot.graph, slot._graph_of = graph, of
        return False


def overhead_ci90(ours: list, plain: list) -> dict:
    """90% bootstrap intervals (rounds resampled with replacement, common.bootstrap_ci90) of the loop overhead two
    ways: the ratio of medians minus 1, and the median of the per-round ratios minus 1 (rounds paired as they ran)."""
    a, b = np.asarray(ours), np.asarray(plain[:len(ours)])
    return {"ratio_of_medians": bootstrap_ci90(lambda p: np.median(a[p], axis=1) / np.median(b[p], axis=1) - 1,
                                               len(a)),
            "paired": bootstrap_ci90(lambda p: np.median(a[p] / b[p], axis=1) - 1, len(a))}


def write_bound(trace_path: Path, work: Path, plain_cycle_s: float) -> dict:
    """What writing the enriched trace's bytes alone costs (the same atomic write, no enrichment): a floor under
    any enrichment that puts the CTA events into the trace file, against the 2% of a plain cycle it may add."""
    data = trace_path.read_bytes()
    times = []
    for i in range(5):
        t = time.perf_counter()
        write_trace(data, work / f"bound-{i}.json")
        times.append(time.perf_counter() - t)
    return {"trace_bytes": len(data), "write_s": quantiles(times), "budget_s_at_2pct": 0.02 * plain_cycle_s,
            "write_over_budget": float(np.median(times)) / (0.02 * plain_cycle_s)}


def coverage(trace_path: Path, n_sm: int) -> dict:
    trace = load_trace(trace_path)
    events = trace["traceEvents"]
    per_kernel = {}
    for launch in launches(trace):
        ctas = [ev for ev in events if ev.get("cat") == CTA_CATEGORY and ev["args"]["launch"] == launch["launch"]]
        programs = [ev["args"]["program"] for ev in ctas]
        kernel = events[launch["launch"]]
        inside = all(kernel["ts"] - TICK_NS / 1000 <= ev["ts"] and ev["ts"] + ev["dur"] <= kernel["ts"] +
                     kernel["dur"] + TICK_NS / 1000 for ev in ctas)
        row = per_kernel.setdefault(launch["kernel"], {"launches": 0, "ctas": 0, "each_program_once": True,
                                                       "sms_in_range": True, "inside_kernel": True,
                                                       "max_misalignment_ns": 0})
        row["launches"] += 1
        row["ctas"] += len(ctas)
        row["each_program_once"] &= sorted(programs) == list(range(len(programs)))
        row["sms_in_range"] &= all(0 <= ev["args"]["sm"] < n_sm for ev in ctas)
        row["inside_kernel"] &= inside
        row["max_misalignment_ns"] = max(row["max_misalignment_ns"], launch["max_misalignment_ns"])
    return {"trace": trace_path.name, "kernels": per_kernel,
            "alignment": {d: m["alignment"] for d, m in trace["l2topo"]["devices"].items()}}


def hta_check(trace_path: Path, work: Path) -> dict:
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError as exc:
        return {"skipped": f"holistictraceanalysis is not importable ({exc})"}
    rich = load_trace(trace_path)
    write_trace(strip(rich), work / "hta_plain" / "rank0.json")
    write_trace(rich, work / "hta_rich" / "rank0.json")
    try:
        a = TraceAnalysis(trace_dir=str(work / "hta_plain")).get_gpu_kernel_breakdown(visualize=False)
    except Exception as exc:  # HTA itself, on the unenriched trace: nothing to compare here
        import pandas

        return {"skipped": f"HTA cannot parse even the plain trace here ({type(exc).__name__}: {exc}; "
                           f"pandas {pandas.__version__}); tests/test_profiler_fixture.py runs the check on the "
                           f"recorded H200 trace where HTA works"}
    try:
        b = TraceAnalysis(trace_dir=str(work / "hta_rich")).get_gpu_kernel_breakdown(visualize=False)
    except Exception as exc:  # recorded, not raised: the rest of the figures stand
        import pandas

        return {"breakdown_equal": None, "enriched_failed": f"{type(exc).__name__}: {exc} (pandas "
                                                            f"{pandas.__version__}); the plain trace parsed"}
    same = all(x.sort_values(list(x.columns)).reset_index(drop=True).equals(
        y.sort_values(list(y.columns)).reset_index(drop=True)) for x, y in zip(a, b))
    return {"breakdown_equal": same, "kernels": int(len(a[1]))}


TABLE = "profiler"
OVERHEAD_QUANTILES = {"cycle_wall_s": "s", "loop_s_per_cycle": "s", "exit_s": "s", "active_gpu_ms": "ms",
                      "handler_s": "s"}


def table_rows(figures: dict) -> list:
    """Compiled out (ms per launch), the overhead against plain torch.profiler per variant (the loop per cycle,
    the block's end, the GPU time of the active steps, the handler; the loop's overhead as a fraction of
    plain's), the adjacent-cycle comparison (us per profiled cycle) and whether HTA read the trace alike."""
    c = figures["compiled_out"]
    rows = quantile_rows(c["ms"], "compiled out", "ms") + [row("compiled out", k, "x", c[k]) for k in (
        "ptx_equal_to_plain_kernel", "record_off_over_plain", "record_on_over_plain")]
    for key, case in (("overhead", "overhead"), ("overhead_larger_step", "overhead, larger step")):
        o = figures.get(key)
        if o:
            for metric, unit in OVERHEAD_QUANTILES.items():
                rows += [row(case, f"{metric.rsplit('_', 1)[0]} {variant}", unit, q)
                         for variant, q in o.get(metric, {}).items()]
            rows += [row(case, f"loop_overhead {v}", "fraction", x) for v, x in o["loop_overhead"].items()]
    a = figures.get("overhead_adjacent_cycles")
    if a:
        rows += [row("adjacent cycles", "diff", "us", a["diff_us"]),
                 row("adjacent cycles", "mean_diff_over_plain_cycle", "fraction",
                     a.get("mean_diff_over_b_median", a["diff_over_b_median"]))]
    for key, case in (("overhead", "end wait"), ("overhead_larger_step", "end wait, larger step")):
        e = figures.get(key, {}).get("end_wait")
        if e:
            rows += [row(case, k, "s", e[k]) for k in ("background_s", "plain_exports_s", "allowed_s")]
            rows.append(row(case, "meets_target", "bool", e["meets_target"]))
    m = figures.get("mechanisms")
    if m:
        rows += [row("mechanisms", k, "fraction", m[k]) for k in ("held_drains", "drain_every_cycle",
                                                                   "drain_without_graph")]
    if "breakdown_equal" in figures.get("hta", {}):
        rows.append(row("hta", "breakdown_equal", "bool", figures["hta"]["breakdown_equal"]))
    return rows


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=16)
    parser.add_argument("--cycles", type=int, default=8, help="profiling cycles per profiler block")
    parser.add_argument("--heavy-ms", type=float, default=100.0,
                        help="also time a larger step: the model plus this many ms of matmuls (0: skip)")
    parser.add_argument("--heavy-reps", type=int, default=3, help="rounds of the larger step")
    parser.add_argument("--adjacent-blocks", type=int, default=16,
                        help=f"blocks of {ADJACENT_CYCLES} cycles, one of ours to three plain (0: skip)")
    parser.add_argument("--inline-reps", type=int, default=1,
                        help="rounds that also time the inline variant (the first ones; each of its blocks takes s)")
    parser.add_argument("--keep-trace", default=None, help="directory to keep the last enriched trace in (gzipped)")
    args = parser.parse_args(argv)
    dev, topo, ident = calibrated_device(args.device, "profiler")
    # made now, for the cycles a drain holds: a recorder keeps the capacity it was made with
    recording.recorder(dev.index, session.held_capacity(CAPACITY))
    work = Path(tempfile.mkdtemp(prefix="l2topo-bench-profiler-"))
    figures = {"calibration": ident, "compiled_out": compiled_out(dev, args.reps)}
    print("compiled out:", {k: v for k, v in figures["compiled_out"].items() if k != "ms"}, flush=True)
    step, which = model_step(dev)
    figures["overhead"], last = overhead(dev, args.reps, work, args.cycles, step, which, args.inline_reps)
    print("overhead:", {k: figures["overhead"][k] for k in ("model", "loop_overhead", "loop_overhead_ci90",
                                                            "cycle_overhead", "post_processing_s", "meets_target")},
          flush=True)
    if args.adjacent_blocks > 0:
        with torch.no_grad():
            adjacent = ours_against_plain(step, dev, work / "adjacent", args.adjacent_blocks, ADJACENT_CYCLES,
                                          ("ours", "ours_draining_every_cycle"))
            with drains_without_graphs():
                no_graphs = ours_against_plain(step, dev, work / "adjacent_no_graphs", args.adjacent_blocks,
                                               ADJACENT_CYCLES, ("ours",))
        figures["mechanisms"] = {
            "what": "what each part of the records' hand-off earns, as the adjacent comparison's mean extra time "
                    "per profiled cycle over one plain cycle: held drains (one drain for up to 9 cycles) against a "
                    "drain every cycle, in the same blocks; the drain as one CUDA graph against its operations "
                    "one by one, in blocks of their own",
            "held_drains": adjacent["ours"]["mean_diff_over_b_median"],
            "drain_every_cycle": adjacent["ours_draining_every_cycle"]["mean_diff_over_b_median"],
            "drain_without_graph": no_graphs["ours"]["mean_diff_over_b_median"],
            "diff_us": {"held_drains": adjacent["ours"]["diff_us"],
                        "drain_every_cycle": adjacent["ours_draining_every_cycle"]["diff_us"],
                        "drain_without_graph": no_graphs["ours"]["diff_us"]}}
        print("mechanisms:", {k: v for k, v in figures["mechanisms"].items() if k not in ("what", "diff_us")},
              flush=True)
        figures["overhead_adjacent_cycles"] = {
            "what": "each torch_l2topo.profile cycle plus the cycle after it against the two-cycle units of plain "
                    "cycles on either side, in the same blocks (benchmarks/profiler_cycles.py): "
                    "the loop's drift cancels; diff_us per profiled cycle, (mean_)diff_over_b_median over one "
                    "plain cycle; the target is read on the mean, which counts a drain held for several cycles at "
                    "its share",
            "cycles_per_block": ADJACENT_CYCLES, "blocks": args.adjacent_blocks, **adjacent["ours"],
            "exit_s": adjacent["exit_s"], "target_overhead": 0.02}
        figures["overhead_adjacent_cycles"]["meets_target"] = \
            figures["overhead_adjacent_cycles"]["mean_diff_over_b_median"] <= 0.02
        # the blocks' reading drifts by +-3-4% between runs of this size; both must be within the target
        figures["meets_overhead_target"] = figures["overhead"]["meets_target"] and \
            figures["overhead_adjacent_cycles"]["meets_target"]
        print("overhead, adjacent cycles:", figures["overhead_adjacent_cycles"]["mean_diff_over_b_median"],
              figures["overhead_adjacent_cycles"]["diff_us"], flush=True)
    if args.heavy_ms > 0:
        figures["overhead_larger_step"], _ = overhead(
            dev, args.heavy_reps, work / "heavy", args.cycles, heavy_step(step, dev, args.heavy_ms),
            f"{which} + about {args.heavy_ms:g} ms of 8192^2 bf16 matmuls per step", args.inline_reps)
        print("overhead, larger step:", {k: figures["overhead_larger_step"][k] for k in (
            "loop_overhead", "cycle_overhead", "meets_target")}, flush=True)
    figures["coverage"] = coverage(last, topo.n_sm)
    figures["hta"] = hta_check(last, work)
    if args.keep_trace:  # the last enriched trace, gzipped: HTA or the summary can be rerun on it elsewhere
        write_trace(load_trace(last), Path(args.keep_trace) / "profiler_h200_last_trace.json.gz")
    print("coverage:", figures["coverage"]["kernels"], "hta:", figures["hta"], flush=True)
    path = write_result(args.out, figures, args.device, TABLE, table_rows(figures))
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
