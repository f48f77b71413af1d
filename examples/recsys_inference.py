"""A small DLRM-style recommender with torch_l2topo.ops.embedding_bag in place of nn.EmbeddingBag, profiled.

Dense features go through a bottom MLP; each sparse feature pools a bag of rows from its own embedding table
(eight tables of 2 MB each on a GPU: all of them fit in the L2); the pooled rows and the dense output go through
a top MLP to a click probability. The script checks the op's pooled rows against nn.EmbeddingBag on the same
tables, times a step with each, and profiles a few steps: with torch_l2topo.profile (the profiler hook: one
trace per cycle with the L2 map and per-SM timelines) where this version has it, else with torch.profiler
alone (it says so), printing the ops that took the time. Without a GPU everything runs on the CPU (the op's
PyTorch path) at a smaller batch, and the trace has no GPU tracks.

    python examples/recsys_inference.py [--out DIR] [--batch 4096]
"""
import argparse
import time
from pathlib import Path

import torch

import torch_l2topo
from torch_l2topo.ops import embedding_bag

N_TABLES, N_ROWS, DIM, BAG, N_DENSE = 8, 8192, 64, 20, 13  # a table: 8192 x 64 fp32 = 2 MB


class DLRM(torch.nn.Module):
    """Bottom MLP on dense features, one pooled bag per sparse feature, top MLP on their concatenation."""

    def __init__(self, use_op: bool = True):
        super().__init__()
        self.use_op = use_op
        self.tables = torch.nn.ParameterList(torch.nn.Parameter(torch.randn(N_ROWS, DIM) / DIM ** 0.5)
                                             for _ in range(N_TABLES))
        self.bottom = torch.nn.Sequential(torch.nn.Linear(N_DENSE, 128), torch.nn.ReLU(), torch.nn.Linear(128, DIM))
        self.top = torch.nn.Sequential(torch.nn.Linear(DIM * (N_TABLES + 1), 256), torch.nn.ReLU(),
                                       torch.nn.Linear(256, 1))

    def pooled(self, indices, offsets) -> list:
        if self.use_op:
            return [embedding_bag(indices[t], table, offsets, mode="sum") for t, table in enumerate(self.tables)]
        return [torch.nn.functional.embedding_bag(indices[t], table, offsets, mode="sum")
                for t, table in enumerate(self.tables)]

    def forward(self, dense, indices, offsets):
        features = [self.bottom(dense), *self.pooled(indices, offsets)]
        return torch.sigmoid(self.top(torch.cat(features, dim=1))).squeeze(1)


def batch_of(n: int, device) -> tuple:
    """Dense features, per-table indices (N_TABLES, n * BAG) and the shared offsets of n bags of BAG rows."""
    g = torch.Generator().manual_seed(0)
    dense = torch.randn(n, N_DENSE, generator=g)
    indices = torch.randint(0, N_ROWS, (N_TABLES, n * BAG), generator=g)
    offsets = torch.arange(0, n * BAG, BAG)
    return dense.to(device), indices.to(device), offsets.to(device)


def step_ms(fn, steps: int, gpu: bool) -> float:
    fn()
    if gpu:
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        fn()
    if gpu:
        torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start) / steps


def profiled(model, inputs, out_dir: Path, gpu: bool):
    """Profile 2 steps after a warm-up step; returns what was written (trace files) or the summary table."""
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if gpu else [])
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=2)
    profile = getattr(torch_l2topo, "profile", None)  # the profiler hook, where this version has it
    if profile is None:
        print("torch_l2topo.profile is not in this version: profiling with torch.profiler alone (no per-SM tracks)")
        tables = []
        sort = "cuda_time_total" if gpu else "cpu_time_total"
        with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=lambda prof: tables.append(
                prof.key_averages().table(sort_by=sort, row_limit=8))) as prof:
            for _ in range(3):
                model(*inputs)
                prof.step()
        return "\n".join(tables)
    topology = "cached" if gpu else {0: torch_l2topo.load_example()}
    with profile(out_dir, schedule=schedule, activities=activities, topology=topology) as prof:
        for _ in range(3):
            model(*inputs)
            prof.step()
    return "\n".join(f"wrote {p} (open it in https://ui.perfetto.dev)" for p in prof.written)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="l2topo-traces", help="trace directory (default: l2topo-traces)")
    p.add_argument("--batch", type=int, default=None, help="samples per step (default: 4096 on a GPU, 256 on CPU)")
    p.add_argument("--steps", type=int, default=None, help="timed steps (default: 20 on a GPU, 3 on the CPU)")
    args = p.parse_args(argv or [])
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if not gpu:
        print("No CUDA GPU: the model runs on the CPU (embedding_bag's PyTorch path), at a small batch")
    n = args.batch or (4096 if gpu else 256)
    ours = DLRM(use_op=True).to(device).eval()
    torch_only = DLRM(use_op=False).to(device).eval()
    torch_only.load_state_dict(ours.state_dict())
    inputs = batch_of(n, device)
    with torch.no_grad():
        for mine, theirs in zip(ours.pooled(*inputs[1:]), torch_only.pooled(*inputs[1:])):
            torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-5)
        steps = args.steps or (20 if gpu else 3)
        times = {name: step_ms(lambda m=m: m(*inputs), steps, gpu)
                 for name, m in (("torch_l2topo.ops.embedding_bag", ours), ("nn.functional.embedding_bag", torch_only))}
        print(f"DLRM step, batch {n}, {N_TABLES} tables of {N_ROWS} x {DIM}, bags of {BAG} ({device.type}):")
        for name, ms in times.items():
            print(f"  {name:32s} {ms:8.3f} ms")
        out = Path(args.out)
        print(profiled(ours, inputs, out, gpu))
    return times


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main, __import__("sys").argv[1:]))
