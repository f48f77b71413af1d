"""Profile a small model with torch_l2topo.profile: an @sm_aware op and a torch op, one enriched trace per cycle.

The model looks rows up in a table with an @sm_aware Triton kernel (written to the placement contract v2:
its helpers take the PLACE constexpr, and record one entry per CTA when the profiler is on), then projects
them with nn.Linear. The trace opens in Perfetto (https://ui.perfetto.dev: "Open trace file") or
chrome://tracing: the GPU's "L2 map" process has one track per SM, ordered by L2 partition and latency, the
gather's CTAs on them, and one slice per launch with its busy time per SM, tail and placement estimate.

Without a GPU it still profiles the model's CPU ops (the lookup as torch.index_select) and adds the L2 map
of the default bundled calibration, and says what it skipped.

    python examples/profile_model.py [--out DIR] [--graph] [--cycles N]
    python -m torch_l2topo trace-summary DIR/<trace>.json
"""
import argparse
from pathlib import Path

import torch

import torch_l2topo

N_ROWS, DIM, BATCH = 1 << 16, 64, 1 << 14


def gather_op():
    """The @sm_aware row gather (contract v2), or None where Triton or a GPU is missing."""
    if not torch.cuda.is_available():
        return None
    import triton
    import triton.language as tl

    from torch_l2topo.triton_kernels.placement import plan_finish, plan_next, plan_start

    @torch_l2topo.sm_aware  # "auto": a plain launch unless placement pays on this GPU
    @triton.jit
    def gather_rows(table_ptr, idx_ptr, out_ptr, dim, plan_ptr, state_ptr, PLACE: tl.constexpr,
                    BLOCK: tl.constexpr):
        sm, t0 = plan_start(plan_ptr, state_ptr, PLACE)
        item, phase = plan_next(plan_ptr, state_ptr, sm, 0, PLACE)
        n_done = 0
        cols = tl.arange(0, BLOCK)
        while item >= 0:
            row = tl.load(idx_ptr + item).to(tl.int64)
            values = tl.load(table_ptr + row * dim + cols, mask=cols < dim)
            tl.store(out_ptr + item.to(tl.int64) * dim + cols, values, mask=cols < dim)
            n_done += 1
            item, phase = plan_next(plan_ptr, state_ptr, sm, phase, PLACE)
        plan_finish(plan_ptr, state_ptr, sm, t0, n_done, PLACE)

    def gather(table, idx):
        out = torch.empty(idx.numel(), table.shape[1], device=table.device, dtype=table.dtype)
        gather_rows(table, idx, out, table.shape[1], BLOCK=triton.next_power_of_2(table.shape[1]),
                    n_items=idx.numel())
        return out

    return gather


class Model(torch.nn.Module):
    def __init__(self, gather=None):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(N_ROWS, DIM), requires_grad=False)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.gather = gather

    def forward(self, idx):
        rows = self.gather(self.table, idx) if self.gather else torch.index_select(self.table, 0, idx)
        return self.proj(rows)


def run(out_dir, *, cycles: int = 1, graph: bool = False, steps_per_cycle: int = 2) -> list:
    """Profile `cycles` cycles of the model (each: 1 warmup step, steps_per_cycle active steps); returns the
    traces written. graph: run each step as a CUDA graph replay (captured while recording)."""
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    model = Model(gather_op()).to(device)
    idx = torch.randint(0, N_ROWS, (BATCH,), device=device)
    step = lambda: model(idx)  # noqa: E731
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps_per_cycle, repeat=cycles)
    topology = "cached" if gpu else {0: torch_l2topo.load_example()}
    with torch_l2topo.profile(out_dir, schedule=schedule, activities=activities, topology=topology) as prof:
        if graph:
            step = _graphed(step)
        for _ in range(cycles * (1 + steps_per_cycle)):
            step()
            prof.step()
    return prof.written


def _graphed(step):
    """step() captured as a CUDA graph (warmed up on a side stream first, as torch.cuda.graphs asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def main(argv=None) -> list:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="l2topo-traces", help="trace directory (default: l2topo-traces)")
    p.add_argument("--graph", action="store_true", help="replay each step as a CUDA graph")
    p.add_argument("--cycles", type=int, default=1, help="profiling cycles (one trace each)")
    args = p.parse_args(argv or [])
    out = Path(args.out)
    if not torch.cuda.is_available():
        print("No CUDA GPU: profiling the CPU ops only (the @sm_aware gather runs as torch.index_select, so there "
              "are no per-CTA tracks); the L2 map is the default bundled calibration's.")
        if args.graph:
            print("--graph skipped: CUDA graphs need a GPU")
    written = run(out, cycles=args.cycles, graph=args.graph and torch.cuda.is_available())
    from torch_l2topo.profiler import format_summary, summarize
    from torch_l2topo.profiler.trace.tracefile import load_trace

    for path in written:
        print(f"wrote {path} (open it in https://ui.perfetto.dev or chrome://tracing)")
        print(format_summary(summarize(load_trace(path), str(path))))
    return written


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main, __import__("sys").argv[1:]))
