"""Command line: `python -m torch_l2topo [calibrate|show|report|examples|geometry|trace-summary] ...`. Thin:
parse, call the library, print. Every failure the library reports on purpose is one line on stderr and exit status 2."""
from __future__ import annotations

import argparse
import sys

from .bundled import DEFAULT_EXAMPLE, list_examples, load_example, load_topology
from .errors import L2TopoError
from .measure.cache import cache_dir
from .measure.launch import BACKEND_CHOICES
from .measure.probes import DEFAULT_MODE, MODES


def _emit(topo, as_json: bool) -> None:
    print(topo.to_json() if as_json else topo.summary())


def cmd_calibrate(args) -> int:
    from .measure.calibration import calibrate

    topo = calibrate(args.device, backend=args.backend, mode=args.mode, force=args.force, gpc=args.gpc,
                     check=not args.no_check)
    if args.out:
        topo.save(args.out)
    _emit(topo, args.json)
    return 0


def cmd_show(args) -> int:
    _emit(load_topology(args.file or args.example), args.json)
    return 0


def _calibration_of(args):
    """A saved calibration (path or bundled name) when given, else this machine's GPU (calibrate())."""
    if args.file:
        return load_topology(args.file)
    from .measure.calibration import calibrate

    return calibrate(args.device)


def cmd_enroll(args) -> int:
    from .identity.registry import Registry

    reg = Registry(args.registry)
    topo = _calibration_of(args)
    if reg.names():  # say first whether this GPU is already there, perhaps under another uuid
        print("before enrolling: " + reg.identify(topo).explain())
    path = reg.add(args.name, topo, replace=args.replace)
    m = topo.meta
    print(f"enrolled {args.name!r} ({path}): {m.get('device', {}).get('name', '?')}, uuid hash "
          f"{m.get('uuid_hash') or 'unknown'}, board serial hash {m.get('serial_hash') or 'unknown'}")
    return 0


def cmd_identify(args) -> int:
    import json

    from .identity.registry import Registry

    found = Registry(args.registry).identify(_calibration_of(args))
    print(json.dumps(found.to_dict(), indent=1) if args.json else found.explain())
    return 0


def cmd_report(args) -> int:
    from .report.markdown import write_report

    topo = load_topology(args.file or args.example)
    geometry = None
    if args.geometry:
        from .geometry.figures import load_geometry

        geometry = load_geometry(args.geometry)
    path = write_report(topo, args.out_dir, other=load_topology(args.compare) if args.compare else None,
                        geometry=geometry)
    print(f"wrote {path}")
    return 0


def cmd_geometry(args) -> int:
    import json

    from .files import json_default
    from .geometry.suite import summary_lines

    if args.from_file:  # a recorded result: no GPU
        from .geometry.figures import load_geometry

        result = load_geometry(args.from_file)
    else:
        from .geometry.suite import run_suite

        result = run_suite(quick=args.quick, device=args.device)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"command": " ".join(sys.argv), **result}, f, indent=1, default=json_default)
    print("\n".join(summary_lines(result)))
    if args.figures:
        from .geometry.figures import draw_geometry_figures

        try:
            files = draw_geometry_figures(result, args.figures)
        except ImportError:
            print("no figures: matplotlib is not installed (`pip install torch-l2topo[plots]` adds them)")
        else:
            print(f"wrote {len(files)} figures to {args.figures}: {', '.join(files.values())}")
    return 0


def cmd_trace_summary(args) -> int:
    import json

    from .files import json_default
    from .profiler.summary import format_summary, summarize
    from .profiler.tracefile import load_trace

    trace = load_trace(args.trace)
    summary = summarize(trace, args.trace)
    print(json.dumps(summary, indent=1, default=json_default) if args.json else format_summary(summary))
    if args.timeline:
        from .profiler.timeline import render_timeline

        print(f"wrote {render_timeline(trace, args.timeline, kernel=args.kernel)}", file=sys.stderr if args.json
              else sys.stdout)
    return 0


def cmd_main_job(args) -> int:
    """No subcommand: calibrate the local GPU; without one, show the bundled H200 calibration and say so."""
    import torch

    if torch.cuda.is_available():
        return cmd_calibrate(argparse.Namespace(device=None, backend="auto", mode=DEFAULT_MODE, force=False,
                                                gpc=False, out=None, json=False, no_check=False))
    topo = load_example(DEFAULT_EXAMPLE)
    dev = topo.meta["device"]
    print(f"No CUDA GPU on this machine: showing bundled data, a real calibration of an {dev['name']} "
          f"(uuid-hash {topo.meta['uuid_hash']}) measured {topo.meta['date']} "
          f"[{topo.meta['backend']}, {topo.meta['mode']}].\n")
    print(topo.summary())
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_l2topo",
                                description="Per-SM L2 latency maps of NVIDIA GPUs. Without a command: "
                                            "calibrate the local GPU, or show bundled H200 data without one.")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("calibrate", help="measure (or load from the cache) this GPU's map and summarize it")
    c.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    c.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    c.add_argument("--mode", choices=MODES, default=DEFAULT_MODE,
                   help="SMs measuring at once: waves of 16 (default), serialized (1), concurrent (all)")
    c.add_argument("--force", action="store_true", help="measure even if a cached calibration exists")
    c.add_argument("--gpc", action="store_true",
                   help="also record each SM's GPC from thread-block clusters (sm_90+, builds the CUDA extension)")
    c.add_argument("--no-check", action="store_true",
                   help="return the map even when its self-checks fail (a busy GPU); it is then never cached")
    c.add_argument("--out", help="also save the calibration to this .npz file")
    c.add_argument("--json", action="store_true", help="print JSON instead of the text summary")
    c.set_defaults(func=cmd_calibrate)
    s = sub.add_parser("show", help="summarize a saved or bundled calibration")
    s.add_argument("file", nargs="?", help="a saved calibration (.npz); default: a bundled example")
    s.add_argument("--example", default=DEFAULT_EXAMPLE,
                   help=f"bundled calibration to show (default {DEFAULT_EXAMPLE}); see `examples`")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_show)
    r = sub.add_parser("report", help="analyse a calibration: Markdown report with PNG figures")
    r.add_argument("file", nargs="?", help="a saved calibration (.npz); default: a bundled example")
    r.add_argument("--example", default=DEFAULT_EXAMPLE,
                   help=f"bundled calibration to analyse (default {DEFAULT_EXAMPLE}); see `examples`")
    r.add_argument("--compare", help="a second calibration of the same GPU (.npz path or bundled name): "
                                     "adds how partitions, clusters and slice classes hold between the two")
    r.add_argument("--geometry", help="a result of `geometry --out` (or benchmarks/run_geometry.py): adds the L2 "
                                      "geometry section with its figures")
    r.add_argument("-o", "--out-dir", default="l2topo-report", help="output directory (default l2topo-report)")
    r.set_defaults(func=cmd_report)
    for verb, func, text in (("enroll", cmd_enroll, "add a GPU's fingerprint to a registry under a name"),
                             ("identify", cmd_identify, "which enrolled GPU made a calibration: match, no match "
                                                        "or ambiguous, and whether its uuid changed")):
        f = sub.add_parser(verb, help=text)
        if verb == "enroll":
            f.add_argument("name", help="entry name (letters, digits, '.', '_', '-')")
            f.add_argument("--replace", action="store_true", help="overwrite an entry of that name")
        f.add_argument("file", nargs="?", help="a saved calibration (.npz) or bundled name; default: calibrate "
                                               "this machine's GPU")
        f.add_argument("--device", type=int, default=None, help="CUDA device index when calibrating")
        f.add_argument("--registry", default=str(cache_dir() / "registry"),
                       help="registry directory (default: <calibration cache>/registry)")
        if verb == "identify":
            f.add_argument("--json", action="store_true", help="print the evidence as JSON")
        f.set_defaults(func=func)
    e = sub.add_parser("examples", help="list the bundled calibrations")
    e.set_defaults(func=lambda args: print("\n".join(list_examples())) or 0)
    g = sub.add_parser("geometry", help="measure the L2 geometry: line, capacity knees, hashing, contention, "
                                        "prefetching, persisting L2 (a GPU; quick: <= 20 s)")
    g.add_argument("--quick", action="store_true", help="short sweeps (<= 20 s on an H200; full: <= 3 min)")
    g.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    g.add_argument("--out", help="also write every curve and derived number to this JSON file")
    g.add_argument("--figures", metavar="DIR", help="draw the main curves as PNGs into DIR (needs matplotlib)")
    g.add_argument("--from", dest="from_file", metavar="FILE",
                   help="summarize (and with --figures draw) a recorded geometry JSON instead of measuring")
    g.set_defaults(func=cmd_geometry)
    t = sub.add_parser("trace-summary", help="per instrumented kernel of a torch_l2topo profiler trace: SM busy time, "
                                             "tail, imbalance, slow-SM share, near share, placement estimate")
    t.add_argument("trace", help="a trace written by torch_l2topo.profile or its trace_handler (.json or .json.gz)")
    t.add_argument("--json", action="store_true", help="print JSON instead of the table")
    t.add_argument("--timeline", metavar="PNG", help="also draw the per-SM timeline of one launch (needs matplotlib)")
    t.add_argument("--kernel", help="the kernel whose launch --timeline draws (default: the first instrumented one; "
                                    "its launch with the longest tail)")
    t.set_defaults(func=cmd_trace_summary)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    func = getattr(args, "func", cmd_main_job)
    try:
        return func(args)
    except (L2TopoError, ValueError, FileNotFoundError) as exc:
        print(f"torch_l2topo: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
