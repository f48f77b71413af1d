"""Serve a gradient-boosted forest with forest_predict: train with scikit-learn, convert once, answer batches.

On a GPU: torch_l2topo.calibrate() at startup (the map the ops' placement reads; until placement is integrated
policy "auto" runs the plain launch), the forest moved to the GPU once, then the step time of one batch through
forest_predict against Hummingbird's PyTorch backend on the same GPU (when hummingbird-ml is installed) and
against scikit-learn's own predict_proba on the CPU. Without a GPU it serves with scikit-learn's predict_proba
(the library's CPU predict), says so, and checks forest_predict's CPU path against it.

    python examples/forest_inference.py [--trees 100] [--depth 5] [--batch 1024] [--steps 20]
"""
import argparse
import time

import numpy as np
import torch

import torch_l2topo
from torch_l2topo.ops import Forest, forest_predict

N_FEATURES = 12


def train(trees: int, depth: int, seed: int = 0):
    """A binary GradientBoostingClassifier on synthetic data (a noisy nonlinear boundary)."""
    from sklearn.ensemble import GradientBoostingClassifier

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(4000, N_FEATURES)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] * x[:, 2] - 0.5 * x[:, 3] ** 2 + 0.3 * rng.normal(size=len(x)) > 0).astype(int)
    return GradientBoostingClassifier(n_estimators=trees, max_depth=depth, random_state=seed).fit(x, y)


def step_ms(fn, steps: int, gpu: bool) -> float:
    """Median wall time of one call (after a warm-up call), synchronizing the GPU around each."""
    fn()
    times = []
    for _ in range(steps):
        if gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if gpu:
            torch.cuda.synchronize()
        times.append(1e3 * (time.perf_counter() - start))
    return float(np.median(times))


def hummingbird_step(model, x):
    """One batch through Hummingbird on x's GPU (its own choice of tree strategy), or None without
    hummingbird-ml."""
    try:
        import hummingbird.ml as hb
    except ImportError:
        return None
    converted = hb.convert(model, "torch").to(x.device)
    return lambda: converted.model(x)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=100)
    p.add_argument("--depth", type=int, default=5)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args(argv or [])
    model = train(args.trees, args.depth)
    batch = np.random.default_rng(1).normal(size=(args.batch, N_FEATURES)).astype(np.float32)
    gpu = torch.cuda.is_available()
    times = {"scikit-learn predict_proba (CPU)": step_ms(lambda: model.predict_proba(batch), args.steps, False)}
    if not gpu:
        print("No CUDA GPU: serving with scikit-learn's own predict_proba on the CPU (forest_predict's GPU kernel "
              "needs a GPU); checking forest_predict's CPU path against it.")
        forest = Forest.from_sklearn(model)
        error = np.abs(forest_predict(forest, torch.from_numpy(batch)).numpy() - model.predict_proba(batch)).max()
        print(f"forest_predict on the CPU: max difference {error:.1e} from predict_proba")
    else:
        topo = torch_l2topo.calibrate()
        print(f"calibrated {topo.meta['device']['name']}: placement policy 'auto' runs the plain launch for now")
        forest = Forest.from_sklearn(model).to("cuda")
        x = torch.from_numpy(batch).cuda()
        with torch.no_grad():
            times["forest_predict (GPU)"] = step_ms(lambda: forest_predict(forest, x), args.steps, True)
            hummingbird = hummingbird_step(model, x)
            if hummingbird is None:
                print("hummingbird-ml is not installed: no Hummingbird comparison")
            else:
                times["Hummingbird (GPU)"] = step_ms(hummingbird, args.steps, True)
    print(f"{args.trees} trees of depth {args.depth}, batch {args.batch}: step time (median of {args.steps})")
    for name, ms in times.items():
        print(f"  {name:34s} {ms:8.3f} ms")
    return times


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main, __import__("sys").argv[1:]))
