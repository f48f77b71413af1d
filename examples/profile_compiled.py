"""Profile a torch.compile'd transformer block with every Triton kernel on the per-SM tracks (kernels="triton").

A small pre-norm block (multi-head attention through scaled_dot_product_attention, then an MLP), bf16, is
compiled by Inductor; torch_l2topo.profile(kernels="triton") runs the instrumented twins of its Triton kernels in
each active cycle, so the trace shows every CTA of Inductor's kernels on the SM that ran it, next to the kernels
it cannot instrument (cuBLAS, flash attention) and their share of the step's GPU time. It then prints the
trace-summary of the last cycle and draws the per-SM timeline of its slowest Triton kernel.

Needs a GPU and Triton; without them it says so and exits 0.

    python examples/profile_compiled.py [--out DIR] [--png FILE] [--cycles N]
    python -m torch_l2topo trace-summary DIR/<trace>.json
"""
import argparse
from pathlib import Path

import torch
from torch import nn

import torch_l2topo

BATCH, SEQ, DIM, HEADS = 8, 512, 1024, 16


class Block(nn.Module):
    """Pre-norm attention + MLP, as in a GPT block."""

    def __init__(self, dim: int = DIM, heads: int = HEADS):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, d // self.heads).unbind(2)
        attn = nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                          is_causal=True)
        x = x + self.proj(attn.transpose(1, 2).reshape(b, s, d))
        return x + self.down(nn.functional.gelu(self.up(self.norm2(x)), approximate="tanh"))


def slowest_triton_kernel(trace_path) -> str | None:
    """The Triton kernel with CTA tracks whose launches took the most GPU time in the trace."""
    from torch_l2topo.profiler.trace.readback import launches
    from torch_l2topo.profiler.trace.tracefile import load_trace

    total: dict = {}
    for launch in launches(load_trace(trace_path)):
        total[launch["kernel"]] = total.get(launch["kernel"], 0) + launch["dur_ns"]
    return max(total, key=total.get) if total else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="l2topo_traces/compiled", help="directory for the traces")
    parser.add_argument("--png", default=None, help="where to draw the slowest Triton kernel's per-SM timeline")
    parser.add_argument("--cycles", type=int, default=2, help="active profiling cycles")
    args = parser.parse_args(argv or [])
    if not torch.cuda.is_available():
        print("no CUDA GPU here: whole-model profiling instruments kernels on a GPU; nothing to do")
        return 0
    torch.manual_seed(0)
    model = Block().cuda().to(torch.bfloat16)
    compiled = torch.compile(model)
    x = torch.randn(BATCH, SEQ, DIM, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        compiled(x)  # compile outside the profiler, as a model usually is
        sched = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=args.cycles)
        acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
        with torch_l2topo.profile(args.out, schedule=sched, activities=acts, kernels="triton") as prof:
            for _ in range(3 * args.cycles):
                compiled(x)
                prof.step()
    last = prof.written[-1]
    print(f"{len(prof.written)} traces in {Path(args.out).resolve()}; the last: {last}")
    from torch_l2topo.profiler import format_summary, render_timeline, summarize
    from torch_l2topo.profiler.trace.tracefile import load_trace

    trace = load_trace(last)
    print(format_summary(summarize(trace, str(last))))
    kernel = slowest_triton_kernel(last)
    if args.png and kernel:
        print(f"per-SM timeline of {kernel}: {render_timeline(trace, args.png, kernel=kernel)}")
    return 0


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main, __import__("sys").argv[1:]))
