"""How far embedding_bag's half-precision gradients fall from an fp32 reference, over many random tables: the data
behind the tolerance of tests/test_ops_gpu.py::test_embedding_bag_gradients_match_torch. For bf16 and fp16, sum
(with per_sample_weights) and mean, 40 random tables on the test's own bags; per gradient (0: the table's, 1:
per_sample_weights'), the table with the worst excess over the test's rtol (|ours - fp32| - 3e-2 |fp32|): that
excess, that table's largest error and its largest reference value.

    python benchmarks/diagnose/diag_bag_grad_rounding.py
"""
import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_ops_gpu import N_ROWS, _bag_case  # noqa: E402

from torch_l2topo.ops import embedding_bag  # noqa: E402


def reference(input, weight, offsets, per_sample_weights=None, **options):
    psw = None if per_sample_weights is None else per_sample_weights.float()
    return F.embedding_bag(input, weight.float(), offsets, per_sample_weights=psw, **options)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=40, help="random tables per dtype and mode")
    args = p.parse_args(argv)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    input, offsets = _bag_case(7, 200, 30)
    for dtype in (torch.bfloat16, torch.float16):
        for mode in ("sum", "mean"):
            worst = {}
            for seed in range(args.seeds):
                base = torch.randn(N_ROWS, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(seed))
                grads = []
                for fn in (embedding_bag, reference):
                    weight = base.to(dtype).requires_grad_()
                    psw = (torch.linspace(-1, 1, input.numel(), device="cuda").to(dtype).requires_grad_()
                           if mode == "sum" else None)
                    fn(input, weight, offsets, mode=mode, per_sample_weights=psw,
                       padding_idx=3).float().square().sum().backward()
                    grads.append([weight.grad] + ([psw.grad] if psw is not None else []))
                for k, (ours, theirs) in enumerate(zip(*grads)):
                    err = (ours.float() - theirs.float()).abs()
                    row = ((err - 3e-2 * theirs.float().abs()).max().item(), err.max().item(),
                           theirs.float().abs().max().item(), seed)
                    worst[k] = max(worst.get(k, row), row)
            for k, (excess, err, top, seed) in worst.items():
                print(f"{str(dtype):15s} {mode:4s} gradient {k}: worst excess {excess:.3f} (seed {seed}), "
                      f"largest error {err:.3f}, largest reference {top:.1f}", flush=True)


if __name__ == "__main__":
    main()
