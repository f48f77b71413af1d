"""What each atomic of a shares-mode program costs at equal concurrency: the chase at 32 items per SM (4,224
one-warp programs, one item each), the hand plain kernel plus one step at a time, in interleaved graph replays.

Every entry's graph zeroes the state before each launch (the plain kernel's too), so the entries differ only in
what their programs do. Starts: "pid" (program p chases item p) or "claim" (the real claim of one item of the
SM's share: an atomic on the SM's cursor, then a load of the item id). Steps after the chase (ENTRIES):
- "fail": a failed claim of the SM's share (returning atomic, 32 programs per word);
- "red": a red (no value returned) on one word every program hits (the tail word); "hot": that atomic
  returning its value (the tail claim), issued once the step before returned;
- "fin": then a returning relaxed atomic on a second shared word (the finish count); "fin_acq_rel": that count
  acq_rel, as plan_finish has it; "fin_sharded": the count on 132 words (program id % 132), the last of each
  then a red on one word;
- "fail||hot": the failed claim and the tail atomic issued together;
- "stats": three reds of statistics on the SM's words before the count (the real way out).
The real persistent `uniform` (at this concurrency each program takes its item by program id: no claim) and the
same kernel on uniform's plan with every item in a share (each program claims) run alongside (their graphs zero
the claims plan's state too, harmless: the kernel resets its own).

    python benchmarks/diag_claim_costs.py --out benchmarks/results/diagnosis/claim_costs_h200.json
"""
from __future__ import annotations

import triton
import triton.language as tl
from bench_placement import (
    GRAPH_LAUNCHES,
    _vs_plain_kernel,
    check_each_once,
    graph_of,
    interleaved,
    uniform_at_equal_concurrency,
)
from common import calibrated_device, gpu_parser, write_result
from placement_workloads import _chase_item

from torch_l2topo.triton_kernels.placement import (
    PLAN_N_SLOTS,
    STATE_CURSORS,
    STATE_FINISHED,
    STATE_TAIL,
    _claim_share,
)
from torch_l2topo.triton_kernels.protocol import sm_id

SHARDS = tl.constexpr(132)
NEVER = tl.constexpr(-(2**40))  # no atomic returns this: a store under it keeps a value used, never storing
TAIL_NONE, TAIL_RED, TAIL_RETURNING, TAIL_WITH_FAIL = (tl.constexpr(k) for k in range(4))
FIN_NONE, FIN_RELAXED, FIN_ACQ_REL, FIN_SHARDED = (tl.constexpr(k) for k in range(4))
# name: (START, FAIL, TAIL, FIN, STATS)
ENTRIES = {
    "plain_kernel": (0, False, TAIL_NONE, FIN_NONE, False),
    "pid, red": (0, False, TAIL_RED, FIN_NONE, False),
    "pid, hot": (0, False, TAIL_RETURNING, FIN_NONE, False),
    "pid, hot+fin": (0, False, TAIL_RETURNING, FIN_RELAXED, False),
    "pid, fin_sharded": (0, False, TAIL_NONE, FIN_SHARDED, False),
    "claim": (1, False, TAIL_NONE, FIN_NONE, False),
    "claim, fail": (1, True, TAIL_NONE, FIN_NONE, False),
    "claim, fail+red": (1, True, TAIL_RED, FIN_NONE, False),
    "claim, fail+hot": (1, True, TAIL_RETURNING, FIN_NONE, False),
    "claim, fail+hot+fin": (1, True, TAIL_RETURNING, FIN_RELAXED, False),
    "claim, fail+hot+fin_acq_rel": (1, True, TAIL_RETURNING, FIN_ACQ_REL, False),
    "claim, fail+hot+fin_sharded": (1, True, TAIL_RETURNING, FIN_SHARDED, False),
    "claim, fail||hot+fin": (1, True, TAIL_WITH_FAIL, FIN_RELAXED, False),
    "claim, fail+hot+stats+fin_acq_rel": (1, True, TAIL_RETURNING, FIN_ACQ_REL, True),
}


@triton.jit
def _used(ptr, value):
    if value == NEVER:
        tl.store(ptr, value)


@triton.jit
def claim_cost_kernel(starts_ptr, ends_ptr, n_loads, plan_ptr, state_ptr, shard_ptr, START: tl.constexpr,
                      FAIL: tl.constexpr, TAIL: tl.constexpr, FIN: tl.constexpr, STATS: tl.constexpr):
    sm = sm_id()
    n_slots = tl.load(plan_ptr + PLAN_N_SLOTS)
    if START == 0:
        item = tl.program_id(0)
    else:
        item = _claim_share(plan_ptr, state_ptr, sm, n_slots)
    if item >= 0:
        _chase_item(starts_ptr, ends_ptr, n_loads, item)
    one = tl.full((), 1, tl.int64)
    go = item >= 0  # true: a chain of conditions that makes each step wait for the one before, as plan_next's do
    if TAIL == TAIL_WITH_FAIL:  # both atomics issued before either value is used
        i = tl.atomic_add(state_ptr + STATE_CURSORS + sm, one, sem="relaxed")
        t = tl.atomic_add(state_ptr + STATE_TAIL, one, sem="relaxed")
        go = (i >= 0) & (t >= 0)
    else:
        if FAIL:
            go = _claim_share(plan_ptr, state_ptr, sm, n_slots) < 0
        if TAIL == TAIL_RED:
            tl.atomic_add(state_ptr + STATE_TAIL, one, sem="relaxed")
        if TAIL == TAIL_RETURNING:
            if go:
                t = tl.atomic_add(state_ptr + STATE_TAIL, one, sem="relaxed")
                _used(ends_ptr, t)
                go = t >= 0
    if go:
        if STATS:
            stats = state_ptr + STATE_CURSORS + n_slots + sm
            tl.atomic_add(stats, one, sem="relaxed")
            tl.atomic_add(stats + n_slots, one, sem="relaxed")
            tl.atomic_add(stats + 2 * n_slots, one, sem="relaxed")
        if FIN == FIN_RELAXED:
            _used(ends_ptr, tl.atomic_add(state_ptr + STATE_FINISHED, one, sem="relaxed"))
        if FIN == FIN_ACQ_REL:
            _used(ends_ptr, tl.atomic_add(state_ptr + STATE_FINISHED, one, sem="acq_rel"))
        if FIN == FIN_SHARDED:
            shard = tl.program_id(0) % SHARDS
            got = tl.atomic_add(shard_ptr + shard, one, sem="relaxed")
            if got == (tl.num_programs(0) - shard + SHARDS - 1) // SHARDS - 1:
                tl.atomic_add(state_ptr + STATE_FINISHED, one, sem="relaxed")


def main(argv=None) -> dict:
    import torch

    p = gpu_parser(__doc__, reps=10)
    p.add_argument("--items-per-sm", type=int, default=32)
    args = p.parse_args(argv)
    dev, topo, calibration = calibrated_device(args.device, "claim costs")
    m = args.items_per_sm
    n, loads, w, ends, uniform, claimed, plan, state = uniform_at_equal_concurrency(dev, topo, m)
    shards = torch.zeros(SHARDS.value, dtype=torch.int64, device=dev)

    def entry(start, fail, tail, fin, stats):
        def run():
            state.zero_()
            shards.zero_()
            claim_cost_kernel[(n,)](w.starts, ends, loads, plan, state, shards, START=start, FAIL=fail, TAIL=tail,
                                    FIN=fin, STATS=stats, num_warps=1)
        return run

    def zeroed(run):
        def zeroed_run():
            state.zero_()  # as every other entry does (the kernel resets its own state; zeroing it is harmless)
            shards.zero_()
            run()
        return zeroed_run

    runs = {"uniform": zeroed(uniform), "uniform, every item claimed": zeroed(claimed),
            **{name: entry(*flags) for name, flags in ENTRIES.items()}}
    check_each_once(runs, ends, w.expected, "claim costs")
    state.zero_()
    graphs = {name: graph_of(run, GRAPH_LAUNCHES).replay for name, run in runs.items()}
    times = interleaved(graphs, args.reps, per_run=GRAPH_LAUNCHES)
    ratios = _vs_plain_kernel(times)
    for k, v in ratios.items():
        print(f"  {k:40s} {v:.4f}  ({times[k]['p50'] * 1e3:.2f} us)", flush=True)
    figures = {"calibration": calibration, "items_per_sm": m, "loads_per_item": loads, "reps": args.reps,
               "timing": "graph replays, state zeroed before every launch (uniform: resets its own)",
               "ms": times, "vs_plain_kernel": ratios}
    write_result(args.out, figures, args.device)
    return figures


if __name__ == "__main__":
    main()
