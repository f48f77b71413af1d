"""Where persistent `uniform` still costs in the gather at equal concurrency, now that each program takes its item
by program id (no claim): the gather at 1, 4 and 16 items per SM, uniform against the hand plain kernel in
interleaved graph replays, with parts of the helpers compiled out. STUB (environment): "" the real helpers,
"timer" (%globaltimer reads return 0), "finish" (plan_finish does nothing: no statistics, no count; only valid
here, where nothing is claimed), "both". One process per STUB (the helpers are replaced before the kernels are
imported):

    for s in "" timer finish both; do STUB=$s python benchmarks/diag_gather_uniform.py; done
"""
import argparse
import os
import sys

import triton
import triton.language as tl

from torch_l2topo.triton_kernels import placement

STUB = os.environ.get("STUB", "")
if STUB not in ("", "timer", "finish", "both"):
    sys.exit(f"STUB must be '', timer, finish or both; got {STUB!r}")
if STUB in ("timer", "both"):
    @triton.jit
    def _no_timer():
        return tl.zeros((), tl.int64)

    placement.global_ns = _no_timer
if STUB in ("finish", "both"):
    @triton.jit
    def _no_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE: tl.constexpr):
        pass

    placement.plan_finish = _no_finish


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    args = p.parse_args(argv)
    import torch
    from bench_placement import GATHER_TABLE_MB, _vs_plain_kernel, graph_of, interleaved
    from common import calibrated_device
    from placement_workloads import gather_kernel, gather_plain_kernel, gather_workload

    from torch_l2topo.placement.sm_aware import sm_aware

    dev, topo, calibration = calibrated_device(args.device, "gather uniform")
    print(f"H200 {calibration['uuid_hash']}, STUB={STUB or 'none'}", flush=True)
    for m in (1, 4, 16):
        n = m * topo.n_sm
        w = gather_workload(dev, GATHER_TABLE_MB << 20, n)
        out = torch.empty_like(w.reference)
        args = (w.table, w.idx, out)
        kernel = sm_aware(gather_kernel, num_warps=1, topology=topo, policy="uniform", ctas_per_sm=m)
        runs = {"plain_kernel": lambda: gather_plain_kernel[(n,)](*args, w.bag, w.dim, num_warps=1),
                "uniform": lambda: kernel(*args, w.bag, w.dim, n_items=n, item_class=w.classes, loads_per_item=1.0)}
        for run in runs.values():
            run()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, w.reference, rtol=1e-5, atol=1e-4)
            out.zero_()
        times = interleaved({k: graph_of(f, 20).replay for k, f in runs.items()}, 10, per_run=20)
        print(f"STUB={STUB or 'none'} gather {m}/SM plain {times['plain_kernel']['p50'] * 1e3:.2f} us "
              f"uniform/plain {_vs_plain_kernel(times)['uniform']:.3f}", flush=True)


if __name__ == "__main__":
    main()
