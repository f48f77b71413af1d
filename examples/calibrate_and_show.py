"""Calibrate the local GPU (or, without one, load a bundled calibration) and show its map.

    python examples/calibrate_and_show.py
"""
import torch

import torch_l2topo


def main() -> torch_l2topo.Topology:
    if torch.cuda.is_available():
        topo = torch_l2topo.calibrate()  # measured once, then served from the cache
    else:
        topo = torch_l2topo.load_example()  # its source line says which one, and why
        print(f"(no GPU here: a bundled calibration of an {topo.meta['device']['name']})")
    print(topo.summary())
    sms = topo.to_frame("sm").sort_values("chain_cycles")
    print("\nfastest SMs (chain cycles per load):", ", ".join(
        f"{int(r.sm)}: {r.chain_cycles:.1f}" for r in sms.head(5).itertuples()))
    print("slowest SMs:", ", ".join(f"{int(r.sm)}: {r.chain_cycles:.1f}" for r in sms.tail(5).itertuples()))
    return topo


if __name__ == "__main__":
    from torch_l2topo.cli import run_script  # a closed pipe (`| head`) ends it quietly

    raise SystemExit(run_script(main))
