"""What CTA recording costs one step of the example model, on the host and on the GPU, without a profiler
(issue 17's overhead diagnosis: which of the two a profiled cycle pays for).

The example's step (its @sm_aware gather of 16,384 one-row programs, then nn.Linear) and the gather alone, with
recording off and on (placement.recording.recording(), which resets the recorder before the chunk, untimed), in
interleaved chunks of CHUNK calls: the host's time to issue a call (the chunk's wall time, the GPU synchronized
before it, not after) and the GPU's time per call (CUDA events around the chunk). Also the host time of the
pieces recording adds to a launch: recording.active_recorder() and the CUDA capture check it makes.

    python benchmarks/diag_record_launch.py --device 0 --out benchmarks/results/diagnosis/record_launch_h100.json
"""
from __future__ import annotations

import time

import numpy as np
import torch
from bench_profiler import CAPACITY, EXAMPLE, example_model
from common import calibrated_device, gpu_parser, quantiles, write_result

from torch_l2topo.placement import recording

CHUNK = 8  # calls per timed chunk: 8 x 16,384 records fit the recorder (CAPACITY)


def _chunk(call, gpu_times: list, host_times: list) -> None:
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t = time.perf_counter()
    start.record()
    for _ in range(CHUNK):
        call()
    end.record()
    host_times.append((time.perf_counter() - t) / CHUNK * 1e6)
    end.synchronize()
    gpu_times.append(start.elapsed_time(end) / CHUNK * 1e3)


def off_against_on(calls: dict, reps: int, dev) -> dict:
    """{call: {off/on: host_us, gpu_us quantiles}, and on - off medians} over reps interleaved chunks."""
    out = {}
    for name, call in calls.items():
        times = {m: {"host_us": [], "gpu_us": []} for m in ("off", "on")}
        for r in range(reps):
            for mode in (("off", "on") if r % 2 == 0 else ("on", "off")):
                if mode == "on":
                    with recording.recording([dev.index], CAPACITY):
                        _chunk(call, times[mode]["gpu_us"], times[mode]["host_us"])
                else:
                    _chunk(call, times[mode]["gpu_us"], times[mode]["host_us"])
        out[name] = {m: {k: quantiles(v) for k, v in t.items()} for m, t in times.items()}
        out[name]["on_minus_off_us"] = {k: float(np.median(times["on"][k]) - np.median(times["off"][k]))
                                        for k in ("host_us", "gpu_us")}
        print(name, out[name]["on_minus_off_us"], flush=True)
    return out


def pieces(dev, n: int = 2000) -> dict:
    """Host us per call of what recording adds to a launch's host path."""
    def per_call(fn):
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6

    with recording.recording([dev.index], CAPACITY):
        active = per_call(lambda: recording.active_recorder(dev.index))
    return {"active_recorder_us": active, "is_current_stream_capturing_us":
            per_call(torch.cuda.is_current_stream_capturing), "calls": n}


def main(argv=None) -> dict:
    parser = gpu_parser(__doc__, reps=200)
    args = parser.parse_args(argv)
    dev, _, _ = calibrated_device(args.device, "record-launch")
    model, idx = example_model(dev)
    calls = {"model_step": lambda: model(idx), "gather": lambda: model.gather(model.table, idx)}
    with torch.no_grad():
        for call in calls.values():  # compile both variants, settle "auto"
            for _ in range(50):
                call()
            with recording.recording([dev.index], CAPACITY):
                call()
        torch.cuda.synchronize()
        figures = {"model": EXAMPLE, "chunk_calls": CHUNK, "chunks_per_mode": args.reps,
                   "calls": off_against_on(calls, args.reps, dev), "pieces": pieces(dev)}
    print("pieces:", figures["pieces"], flush=True)
    path = write_result(args.out, figures, args.device)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
