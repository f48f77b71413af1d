"""The ops' measured ratios as a Markdown table and one figure per op, from a bench_ops.py result (no GPU needed).

    python benchmarks/report_ops.py --from tests/data/ops/ops_h200.json --figures docs/figures
    python benchmarks/report_ops.py --from part1.json part2.json ...   # the slices of one grid (--part K/N)

Prints the tables docs/ops.md shows (one row per shape and timing: ours in ms, the best reference and ours over
it, ours over the plain launch, what "auto" chose) and writes ops_embedding_bag.png (time against batch at the
target row shape, one line per implementation, eager and CUDA graph) and ops_forest.png (time against batch for
each forest, one line per implementation).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

BAG_SHAPE = dict(table_mb=16, dim=64, dtype="float32", bag=32, mode="sum")  # the target's row shape


def _ratio(value) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def bag_table(rows: list) -> str:
    lines = ["| table | row | bag x batch | mode | timing | ours ms | reference | vs reference | vs plain | auto |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['table_mb']} MB | {r['dim']} x {r['dtype']} | {r['bag']} x {r['batch']} | {r['mode']} | "
                     f"{r['timing']} | {r['time_ms']:.4f} | {r['reference']} | {_ratio(r['vs_reference'])} | "
                     f"{_ratio(r['vs_plain'])} | {r['auto_chose']} |")
    return "\n".join(lines)


def forest_table(rows: list) -> str:
    lines = ["| forest | nodes MB | batch | ours ms | fastest layout | reference | vs reference | vs CPU | vs plain |"
             " auto |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} {r['trees']} x d{r['depth']} | {r['nodes_mb']:.1f} | {r['batch']} | "
                     f"{r['time_ms']:.4f} | {r['fastest_layout']} | {r['reference']} | {_ratio(r['vs_reference'])} | "
                     f"{_ratio(r['vs_sklearn_cpu'])} | {_ratio(r['vs_plain'])} | {r['auto_chose']} |")
    return "\n".join(lines)


def _lines(ax, rows: list, title: str) -> None:
    names = sorted({n for r in rows for n, t in r["impl"].items() if "p50" in t and n != "ours"})
    for name in names:
        points = sorted((r["batch"], r["impl"][name]["p50"]) for r in rows if "p50" in r["impl"].get(name, {}))
        ax.plot(*zip(*points), marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="batch (bags / samples)", ylabel="time per call (ms)", title=title)
    ax.legend(fontsize=7)


def figures(doc: dict, out_dir: Path) -> list:
    """ops_embedding_bag.png and ops_forest.png (where the result has those parts); returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    drawn = []
    bags = [r for r in doc["figures"].get("embedding_bag", []) if all(r.get(k) == v for k, v in BAG_SHAPE.items())]
    if bags:
        fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        for ax, timing in zip(axes, ("eager", "graph")):
            _lines(ax, [r for r in bags if r["timing"] == timing],
                   f"embedding_bag, 16 MB x 64 fp32, bags of 32: {timing}")
        drawn.append((out_dir / "ops_embedding_bag.png", fig))
    forests = doc["figures"].get("forest", [])
    kinds = sorted({(r["model"], r["trees"], r["depth"]) for r in forests})
    if kinds:
        fig, axes = plt.subplots(1, len(kinds), figsize=(4.5 * len(kinds), 4), squeeze=False)
        for ax, (model, trees, depth) in zip(axes[0], kinds):
            _lines(ax, [r for r in forests if (r["model"], r["trees"], r["depth"]) == (model, trees, depth)],
                   f"forest_predict: {model}, {trees} trees, depth {depth}")
        drawn.append((out_dir / "ops_forest.png", fig))
    for path, fig in drawn:
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
    return [path for path, _ in drawn]


def merged(docs: list) -> dict:
    """The rows of several result files (the slices of one grid, --part K/N) as one result."""
    return {"figures": {op: [row for doc in docs for row in doc["figures"].get(op, [])]
                        for op in ("embedding_bag", "forest")}}


def _measured_on(doc: dict) -> str:
    env = doc.get("env", {})
    return (f"{env.get('gpu', '?')} (torch {env.get('torch', '?')}, Triton {env.get('triton', '?')}, "
            f"{env.get('date', '?')}): `{doc.get('command', '?')}`")


def main(argv=None) -> str:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="sources", required=True, nargs="+",
                   help="result files of bench_ops.py (the slices of one grid: their rows in order)")
    p.add_argument("--figures", default=None, help="directory for the two figures (default: none)")
    args = p.parse_args(argv)
    docs = [json.loads(Path(source).read_text()) for source in args.sources]
    doc = merged(docs)
    text = ("Measured on " + "; ".join(_measured_on(d) for d in docs) + "\n\n### embedding_bag\n\n"
            f"{bag_table(doc['figures']['embedding_bag'])}\n\n### forest_predict\n\n"
            f"{forest_table(doc['figures']['forest'])}\n")
    print(text)
    if args.figures:
        for path in figures(doc, Path(args.figures)):
            print(f"wrote {path}")
    return text


if __name__ == "__main__":
    main()
