"""What waking or stopping a second process costs the process that does it, on this machine (the profiler
worker's SIGCONT took ~5 ms a call on the H200 machine and 20 us on a 2-core development machine; issue 17).

A child process (python -c) is stopped and continued with os.kill many times while the parent times, in
microseconds: the kill call itself, and a fixed piece of the parent's own work right after it (a Python loop,
and where CUDA is available, small torch launches like a model's), against the same work with nothing sent.
Children: idle (blocked reading its stdin), spinning in Python, or doing JSON work like the trace worker;
at the default priority or at nice 19 under SCHED_IDLE; on any CPU or pinned away from the parent's CPU. Also
the other ways to hand the child a go: a byte down a pipe it waits on, and the SIGCONT sent from a helper
thread of the parent. Also: what a busy child costs the parent's work when it is not stopped at all. And the
machine's facts that bear on it: CPUs and affinity, cgroup CPU quota, clock source, timer resolution.

    python benchmarks/diagnose/diag_signal_cost.py --out benchmarks/results/diagnosis/signal_cost_h200.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common
from common import command_line, write_json

CHILD = r"""
import json, os, sys, time
mode, idle_class, cpu = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
if cpu >= 0:
    os.sched_setaffinity(0, {cpu})
if idle_class:
    os.nice(19)
    os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
print("ready", flush=True)
if mode == "idle":
    for line in sys.stdin:
        pass
elif mode == "spin":
    while True:
        pass
else:
    doc = {"traceEvents": [{"ph": "X", "ts": i * 1.5, "dur": 2.0, "name": "k%d" % i, "args": {"sm": i % 132}}
                           for i in range(20000)]}
    while True:
        json.loads(json.dumps(doc))
"""


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def machine() -> dict:
    flags = ""
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("flags"):
            flags = line
            break
    return {"uname": " ".join(os.uname()), "cpu_count": os.cpu_count(),
            "affinity": sorted(os.sched_getaffinity(0)),
            "hypervisor": " hypervisor" in flags,
            "cpu0_thread_siblings": _read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list"),
            "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max"),
            "cgroup_cpu_weight": _read("/sys/fs/cgroup/cpu.weight"),
            "cgroup_v1_quota": _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),
            "cpu_stat": _read("/sys/fs/cgroup/cpu.stat"),
            "clocksource": _read("/sys/devices/system/clocksource/clocksource0/current_clocksource"),
            "clock_res_ns": time.clock_getres(time.CLOCK_MONOTONIC) * 1e9,
            "autogroup": _read("/proc/sys/kernel/sched_autogroup_enabled"),
            "load": _read("/proc/loadavg")}


def _py_work(n: int = 20_000) -> None:
    s = 0
    for i in range(n):
        s += i


def _torch_work():
    """Small launches on the GPU, no sync: the parent's share of a model's step (None without CUDA)."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    x = torch.ones(1024, device="cuda")

    def work():
        for _ in range(50):
            x.add_(1.0)

    work()
    torch.cuda.synchronize()
    return work


def _child(mode: str, idle_class: bool, cpu: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", CHILD, mode, "1" if idle_class else "0", str(cpu)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    proc.stdout.readline()
    time.sleep(0.2)
    return proc


def _stats(values_ns) -> dict:
    v = np.asarray(values_ns, dtype=float) / 1e3
    return {"p10": float(np.percentile(v, 10)), "p50": float(np.median(v)), "p80": float(np.percentile(v, 80)),
            "p95": float(np.percentile(v, 95)), "max": float(v.max()), "mean": float(v.mean())}


def stop_continue(proc, n: int, works: dict, sender=None) -> dict:
    """n rounds: SIGSTOP, 2 ms of the parent's own work, SIGCONT (by `sender`, default os.kill here), then each
    of `works` timed right after; and each work timed with nothing sent (a round without signals)."""
    send = sender or (lambda: os.kill(proc.pid, signal.SIGCONT))
    out = {"stop": [], "cont": []}
    for key in works:
        out[f"{key}_after_cont"], out[f"{key}_alone"] = [], []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        os.kill(proc.pid, signal.SIGSTOP)
        out["stop"].append(time.perf_counter_ns() - t0)
        deadline = time.perf_counter() + 0.002
        while time.perf_counter() < deadline:
            pass
        t0 = time.perf_counter_ns()
        send()
        out["cont"].append(time.perf_counter_ns() - t0)
        for key, work in works.items():
            t0 = time.perf_counter_ns()
            work()
            out[f"{key}_after_cont"].append(time.perf_counter_ns() - t0)
        time.sleep(0.002)
        for key, work in works.items():
            t0 = time.perf_counter_ns()
            work()
            out[f"{key}_alone"].append(time.perf_counter_ns() - t0)
    return {k: _stats(v) for k, v in out.items()}


def running_cost(proc, n: int, works: dict) -> dict:
    """Each work timed n times with the child running (not stopped), against the same with it stopped."""
    out = {}
    for state, sig in (("child_running", signal.SIGCONT), ("child_stopped", signal.SIGSTOP)):
        os.kill(proc.pid, sig)
        time.sleep(0.05)
        for key, work in works.items():
            t = []
            for _ in range(n):
                t0 = time.perf_counter_ns()
                work()
                t.append(time.perf_counter_ns() - t0)
            out[f"{key}_{state}"] = _stats(t)
    os.kill(proc.pid, signal.SIGCONT)
    return out


def pipe_wake(n: int, works: dict) -> dict:
    """n rounds: a byte down the pipe an idle child waits on (the child reads a line: a wakeup without a signal)."""
    proc = _child("idle", True, -1)
    out = {"write": []}
    for key in works:
        out[f"{key}_after_write"] = []
    try:
        for _ in range(n):
            time.sleep(0.002)
            t0 = time.perf_counter_ns()
            proc.stdin.write("x\n")
            proc.stdin.flush()
            out["write"].append(time.perf_counter_ns() - t0)
            for key, work in works.items():
                t0 = time.perf_counter_ns()
                work()
                out[f"{key}_after_write"].append(time.perf_counter_ns() - t0)
    finally:
        proc.kill()
        proc.wait()
    return {k: _stats(v) for k, v in out.items()}


def threaded_sender(proc):
    """A helper thread that sends SIGCONT when asked: the parent's cost is a queue put."""
    q = queue.SimpleQueue()

    def loop():
        while q.get() is not None:
            os.kill(proc.pid, signal.SIGCONT)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    return (lambda: q.put(1)), (lambda: q.put(None))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    works = {"py": _py_work}
    torch_work = _torch_work()
    if torch_work is not None:
        works["launches"] = torch_work
    parent_cpu = min(os.sched_getaffinity(0))
    other_cpu = max(os.sched_getaffinity(0))
    figures = {"machine": machine(), "unit": "microseconds per call", "rounds": args.rounds,
               "works": {"py": "a 20,000-step Python loop", "launches": "50 torch add_ launches, no sync"}}
    print(figures["machine"], flush=True)
    configs = [("idle", False, -1), ("spin", False, -1), ("spin", True, -1), ("json", True, -1), ("json", False, -1)]
    if other_cpu != parent_cpu:
        configs.append(("json", True, other_cpu))
    for mode, idle_class, cpu in configs:
        name = f"{mode}_{'idleclass' if idle_class else 'nice0'}_{'cpu' + str(cpu) if cpu >= 0 else 'anycpu'}"
        proc = _child(mode, idle_class, cpu)
        try:
            row = stop_continue(proc, args.rounds, works)
            if mode != "idle":
                row["running"] = running_cost(proc, args.rounds // 2, works)
        finally:
            proc.kill()
            proc.wait()
        figures[name] = row
        print(name, {k: round(v["p50"], 1) for k, v in row.items() if "p50" in v},
              {k: round(v["p80"], 1) for k, v in row.items() if "p80" in v}, flush=True)
    proc = _child("json", True, -1)
    send, stop = threaded_sender(proc)
    try:
        figures["json_idleclass_thread_sender"] = stop_continue(proc, args.rounds, works, sender=send)
    finally:
        stop()
        proc.kill()
        proc.wait()
    print("thread sender", {k: round(v["p50"], 1) for k, v in figures["json_idleclass_thread_sender"].items()},
          flush=True)
    figures["pipe_wake"] = pipe_wake(args.rounds, works)
    print("pipe wake", {k: round(v["p50"], 1) for k, v in figures["pipe_wake"].items()}, flush=True)
    env = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "command": command_line()}
    path = write_json(args.out, figures, env)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
