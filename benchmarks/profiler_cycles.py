"""The profiled model and the adjacent-cycle comparison, shared by bench_profiler.py (its overhead target, read
cycle by cycle) and diagnose/diag_profiler_components.py (part 1, by kind of cycle).

The model: examples/profile_model.py's (its @sm_aware gather and nn.Linear), or where placement contract v2 has
not landed, the recorder's demo kernel and nn.Linear. The comparison: torch_l2topo.profile blocks in which three of
every four cycles are plain (no recording; the handler only exports to disk, as plain torch.profiler's
on_trace_ready does) and the fourth takes turns among the compared kinds (KINDS); each compared cycle plus the one
after it (which runs what it deferred: its records' drain) against the two-cycle units of plain cycles just before
and after (unit_pairs), so the loop's drift cancels. tests/test_profiler_bench_design.py checks the arithmetic.
"""
from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np
import torch
from common import bootstrap_ci90, quantiles

from torch_l2topo import layout
from torch_l2topo.measure import recording
from torch_l2topo.profiler import session
from torch_l2topo.profiler.demo import row_sums
from torch_l2topo.profiler.runtime.spool import shared_spool

ROWS, DIM, GRID = 65_536, 64, 528
ACTIVE = 5
CAPACITY = 1 << 17  # records per cycle: 5 active steps of the example's 16,384-CTA gather fit
ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/profile_model.py (@sm_aware gather + nn.Linear)"  # the model the figures are of
SKIP = 2  # cycles left out at each block's start


def example_model(dev) -> tuple:
    """(examples/profile_model.py's Model on `dev`, a batch of its row indices)."""
    spec = importlib.util.spec_from_file_location("profile_model", ROOT / "examples" / "profile_model.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    return example.Model(example.gather_op()).to(dev), torch.randint(0, example.N_ROWS, (example.BATCH,), device=dev)


def model_step(dev):
    """(the step to profile, which model it is): the example's if contract v2 has landed, else the demo one."""
    if hasattr(layout, "PLACE_RECORD"):
        model, idx = example_model(dev)
        return (lambda: model(idx)), EXAMPLE
    x = torch.randn(ROWS, DIM, device=dev)
    proj = torch.nn.Linear(DIM, DIM).to(dev)
    out = torch.empty(ROWS, device=dev)

    def step():
        row_sums(x, grid=GRID, out=out)
        return proj(x)

    return step, "demo model (row_sums + nn.Linear): placement contract v2 not merged, no @sm_aware gather yet"


def cycle_times(step, prof, n: int, at_cycle_start=None) -> list:
    """Wall seconds of each of n cycles (wait 1, warmup 1, ACTIVE active steps) of `prof`, already entered."""
    stamps = []
    for c in range(n):
        if at_cycle_start is not None:
            at_cycle_start(c)
        stamps.append(time.perf_counter())
        for _ in range(2 + ACTIVE):
            step()
            prof.step()
    stamps.append(time.perf_counter())
    return np.diff(stamps).tolist()


def compare(a: np.ndarray, b: np.ndarray, cycles_per_unit: int = 1) -> dict:
    """a against b, pair by pair (each a unit of cycles_per_unit cycles): quantiles, the median and the mean
    difference (us) with bootstrap 90% intervals, and each over the median plain cycle (b / cycles_per_unit). The
    mean counts a cost that only some units pay (a drain held for several cycles) at its share; the median leaves
    it out."""
    diff = (a - b) * 1e6
    plain_us = np.median(b) / cycles_per_unit * 1e6
    return {"a_s": quantiles(a), "b_s": quantiles(b), "pairs": len(diff), "cycles_per_unit": cycles_per_unit,
            "diff_us": {**quantiles(diff), "p50_ci90": bootstrap_ci90(lambda p: np.median(diff[p], axis=1),
                                                                     len(diff)),
                        "mean": float(diff.mean()),
                        "mean_ci90": bootstrap_ci90(lambda p: diff[p].mean(axis=1), len(diff))},
            "diff_over_b_median": float(np.median(diff) / plain_us),
            "mean_diff_over_b_median": float(diff.mean() / plain_us),
            "ratio_of_medians": float(np.median(a) / np.median(b))}


GROUP = 4  # a compared cycle, then three plain ones (unit_pairs)


def kind_sequence(compared) -> list:
    """The kinds of a block's cycles, repeating: each compared kind, then three plain cycles (unit_pairs)."""
    return [k for kind in compared for k in (kind, *["plain"] * (GROUP - 1))]


def unit_pairs(times, kinds: list, skip: int) -> dict:
    """{kind: [(unit, control)]} from one block's cycle times (kinds: kind_sequence's, by cycle). A unit is a
    compared cycle plus the one after it, so that what the compared cycle leaves to its next step (its deferred
    drain) counts against it; its control is the mean of the two-cycle units of clean plain cycles just before
    and just after it (each preceded by a plain cycle). Cycles before `skip` are left out."""
    out = {}
    for c in range(max(skip, 2), len(times) - 3):
        kind = kinds[c % len(kinds)]
        if kind != "plain":
            control = (times[c - 2] + times[c - 1] + times[c + 2] + times[c + 3]) / 2
            out.setdefault(kind, []).append((times[c] + times[c + 1], control))
    return out


# What a cycle of each kind does beyond plain torch.profiler's (plain: no recording, the handler only exports to
# disk). Three of every four cycles are plain (kind_sequence); unit_pairs compares the others with them.
KINDS = {
    "ours": "torch_l2topo.profile as it is",
    "ours_draining_every_cycle": "its records drained in its trace handler (with those of earlier cycles the drain "
                                 "held), as before a drain held several cycles",
    "ours_without_drain": "no records drained (the recorder marked clean by hand, so no later cycle resets it)",
    "ours_without_hand_off": "the job is not handed to the worker (its slots released at once)",
    "ours_without_recording": "nothing recorded; the (empty) drain, the export and the hand-off",
    "plain_with_a_cuda_op": "plain, plus one small CUDA operation (a one-word fill) after the export in its handler",
}


class _NoHandOff:
    """Stands in for the worker: the job is dropped (its trace stays plain) and reported done at once."""

    def keeps_up(self, period_s) -> bool:
        return False

    def submit(self, job, on_done, max_pending=None, beside=False):
        on_done(job.path, None)
        return True


class Alternating(session.profile):
    """torch_l2topo.profile whose cycles take turns: kinds[c % len(kinds)] is cycle c's kind (KINDS, or "plain")."""

    def __init__(self, plain_dir: Path, kinds: list, **options):
        super().__init__(**options)
        self.plain_dir, self.kinds, self.cycle = plain_dir, kinds, 0
        self.word = torch.zeros(1, device="cuda")
        self.on_trace_ready = self._handle

    def _kind(self) -> str:
        return self.kinds[self.cycle % len(self.kinds)]

    def _handle(self, prof) -> None:
        kind = self._kind()
        if kind.startswith("plain"):
            prof.export_chrome_trace(str(self.plain_dir / f"plain-{self.cycle % 4}.json"))
            if kind == "plain_with_a_cuda_op":
                self.word.fill_(1.0)
        elif kind == "ours_without_drain":
            self.handler._cuda = False  # records = {}
            self.handler(prof)
            self.handler._cuda = None
            for r in recording.recorders().values():
                r.dirty = False
        elif kind == "ours_draining_every_cycle":
            held, self.handler.held.per_drain = self.handler.held.per_drain, {}  # one cycle a drain
            self.handler(prof)
            self.handler.held.per_drain = held
        elif kind == "ours_without_hand_off":
            real, self.handler._worker = self.handler._worker, _NoHandOff()
            self.handler(prof)
            self.handler._worker = real
        else:
            self.handler(prof)
        self.cycle += 1

    def _start_recording(self) -> None:
        if self._kind() in ("ours", "ours_draining_every_cycle", "ours_without_drain", "ours_without_hand_off"):
            super()._start_recording()


def ours_against_plain(step, dev, work: Path, blocks: int, cycles: int, compared=tuple(KINDS),
                       capacity: int = CAPACITY, call_times=None) -> dict:
    """Part 1 (module docstring) for the kinds `compared`: per kind, its two-cycle units against the plain ones
    around them (unit_pairs), and how long each block's end waited for its traces."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    sched = torch.profiler.schedule(wait=1, warmup=1, active=ACTIVE, repeat=cycles)
    (work / "plain").mkdir(parents=True, exist_ok=True)
    kinds = kind_sequence(compared)
    recorder = recording.recorder(dev.index, session.held_capacity(capacity), at_least=capacity)
    per_drain = max(recorder.capacity // capacity, 1)  # our cycles a drain holds (spool.py, Held drains)
    # no slot is page-locked in the loop: one for each drain of the block's jobs (held to its end), one more
    shared_spool().reserve(dev.index, recorder.capacity, -(-(cycles // GROUP) // per_drain) + 1, recorder)
    by_kind = {k: [] for k in compared}
    exits = []
    for b in range(blocks + 1):  # block 0 warms up (compilation, the worker's imports)
        # every job held for the block's end: nothing of the worker's lands between cycles (part 2 measures what its
        # work beside the steps costs), and none runs in the loop
        prof = Alternating(work / "plain", kinds, path_or_dir=work / "ours", activities=acts, schedule=sched,
                           devices=[dev.index], capacity=capacity, max_held=cycles, max_pending=cycles + 1)
        torch.cuda.synchronize()
        with prof:
            t = cycle_times(step, prof, cycles, None if call_times is None else
                        lambda c: setattr(call_times, "kind", kinds[c % len(kinds)]))
            t_end = time.perf_counter()
        exits.append(time.perf_counter() - t_end)
        if b:
            for kind, pairs in unit_pairs(t, kinds, SKIP).items():
                by_kind[kind] += pairs
        print(f"ours against plain: block {b}/{blocks}", flush=True)
    out = {"what": {k: KINDS[k] for k in compared}, "exit_s": quantiles(exits[1:])}
    for kind, pairs in by_kind.items():
        a, b = np.array(pairs).T
        out[kind] = compare(a, b, cycles_per_unit=2)
    return out
