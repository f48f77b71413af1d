"""Command line: `python -m torch_l2topo [calibrate|show|report|build|examples|geometry|enroll|identify|fleet|
trace-summary] ...` (also installed as `torch-l2topo`). Thin: parse, call the library, print.

Exit statuses (EXIT_STATUS, shown by --help): 0 done (identify: a match); 1 identify: no match; 3 identify:
ambiguous; 4 fleet: the health verdict is Fail (on every rank); 2 an error, as one line on stderr naming the
file or argument (bad arguments: argparse's usage message); 141 standard output closed early (piped into `head`),
quietly, as a command stopped by SIGPIPE.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .bundled import FALLBACK_MODEL, default_example, describe_example, list_examples, load_example, load_topology
from .distributed.gather import DEFAULT_TIMEOUT_S, GATHER_SLACK_S
from .errors import L2TopoError, RegistryError
from .measure.cache import cache_dir
from .measure.launch import BACKEND_CHOICES
from .measure.probes import DEFAULT_MODE, MODES
from .version import __version__

EXIT_ERROR = 2
EXIT_NO_MATCH = 1
EXIT_AMBIGUOUS = 3
EXIT_HEALTH_FAIL = 4  # fleet: a job script gates on it, as on `dcgmi diag`
EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader went away
EXIT_STATUS = ("exit status: 0 done (identify: match), 1 identify: no match, 3 identify: ambiguous, 4 fleet: "
               "health Fail, 2 error (one line on stderr), 141 output pipe closed early")
_EXAMPLE_DEFAULT = ("default: this machine's GPU model where one is bundled, else " + FALLBACK_MODEL
                    + "; the summary's source line says which")
NEXT_STEP = ("next: `python -m torch_l2topo report` writes l2topo-report/report.md, the analysis of this map "
             "with figures")


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
    path = reg.path_of(args.name)  # a bad name fails before any calibration or identify runs
    if path.exists() and not args.replace:
        raise RegistryError(f"registry entry {args.name!r} exists ({path}); pass --replace to overwrite it")
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

    registry = Registry(args.registry)
    registry.check_exists()  # before calibrating: a mistyped path must not cost a calibration
    found = registry.identify(_calibration_of(args))
    print(json.dumps(found.to_dict(), indent=1) if args.json else found.explain())
    return {"match": 0, "no match": EXIT_NO_MATCH}.get(found.verdict, EXIT_AMBIGUOUS)


def cmd_report(args) -> int:
    from .analysis.summary import same_gpu
    from .report.markdown import write_report

    topo = load_topology(args.file or args.example)
    other = load_topology(args.compare) if args.compare else None
    geometry = None
    if args.geometry:
        from .geometry.figures import load_geometry

        geometry = load_geometry(args.geometry)
    if other is not None and same_gpu(topo, other) is False:
        print(f"note: {args.compare} is a calibration of another GPU (uuid-hash {other.meta.get('uuid_hash')}, "
              f"this one {topo.meta.get('uuid_hash')}): the comparison shows how two GPUs differ")
    path = write_report(topo, args.out_dir, other=other, geometry=geometry)
    print(f"wrote {path}")
    return 0


def cmd_examples(args) -> int:
    names = list_examples()
    default, why = default_example()
    width = max(map(len, names))
    for name in names:
        print(f"{name:{width}}  {describe_example(name)}" + ("  [default]" if name == default else ""))
    print(f"\n[default]: what `show` and `report` use without a file or --example ({why})")
    return 0


def cmd_geometry(args) -> int:
    import json

    from .files import json_default
    from .geometry.summary import summary_lines

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


def _rank_file_fields(template: str) -> None:
    """ValueError unless the --file template replaces only {rank} and {local_rank}."""
    import string

    try:
        fields = [name for _, name, _, _ in string.Formatter().parse(template) if name is not None]
    except ValueError as exc:
        raise ValueError(f"--file {template!r}: {exc} (write {{{{ and }}}} for a literal brace)") from None
    unknown = [name for name in fields if name not in ("rank", "local_rank")]
    if unknown:
        raise ValueError(f"--file {template!r} names {{{unknown[0]}}}; only {{rank}} and {{local_rank}} are replaced")


def cmd_fleet(args) -> int:
    """Under torchrun: every rank calibrates its GPU (or reads --file), the job gathers the fleet, rank 0 prints it;
    every rank exits EXIT_HEALTH_FAIL when the verdict is Fail."""
    import math

    from .distributed import gather_fleet, torchrun_group
    from .distributed.health import FAIL

    if not 0 < args.timeout < math.inf:
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout:g}")
    if args.file:
        _rank_file_fields(args.file)
    with torchrun_group(args.timeout) as joined:
        import torch.distributed as dist

        rank = dist.get_rank() if joined else 0
        topology = load_topology(args.file.format(rank=rank, local_rank=os.environ.get("LOCAL_RANK", "0"))) \
            if args.file else None
        fleet = gather_fleet(topology, timeout_s=args.timeout, identifiers=args.identifiers, backend=args.backend,
                             mode=args.mode, force=args.force,
                             progress=lambda line: print(line, file=sys.stderr, flush=True))
    if rank == 0:
        if not joined:
            print("not under torchrun: the fleet of this process alone (`torchrun --nproc_per_node=N -m "
                  "torch_l2topo fleet` gathers every rank)\n")
        print(fleet.summary())
        if args.out:
            from .files import atomic_write

            atomic_write(Path(args.out), (fleet.to_json() + "\n").encode())
            print(f"\nwrote {args.out}")
    return EXIT_HEALTH_FAIL if fleet.verdict == FAIL else 0


def cmd_trace_summary(args) -> int:
    import json

    from .files import json_default
    from .profiler.trace.summary import format_summary, summarize
    from .profiler.trace.tracefile import load_trace

    trace = load_trace(args.trace)
    summary = summarize(trace, args.trace)
    print(json.dumps(summary, indent=1, default=json_default) if args.json else format_summary(summary))
    if args.timeline:
        from .profiler.trace.timeline import render_timeline

        print(f"wrote {render_timeline(trace, args.timeline, kernel=args.kernel, source=args.trace)}",
              file=sys.stderr if args.json else sys.stdout)
    return 0


def cmd_main_job(args) -> int:
    """No subcommand: calibrate the local GPU; without one, show the default bundled calibration and say so."""
    import torch

    if torch.cuda.is_available():
        cmd_calibrate(argparse.Namespace(device=None, backend="auto", mode=DEFAULT_MODE, force=False, gpc=False,
                                         out=None, json=False, no_check=False))
    else:
        topo = load_example(FALLBACK_MODEL)  # no GPU to match: the fallback, named in the line below
        dev = topo.meta["device"]
        print(f"No CUDA GPU on this machine: showing bundled data, a real calibration of an {dev['name']} "
              f"(uuid-hash {topo.meta['uuid_hash']}) measured {topo.meta['date']} "
              f"[{topo.meta['backend']}, {topo.meta['mode']}].\n")
        print(topo.summary())
    print(f"\n{NEXT_STEP}")
    return 0


def _architecture(text: str) -> tuple:
    try:
        major, minor = (int(x) for x in text.split("."))
    except ValueError:
        raise ValueError(f"--cc takes MAJOR.MINOR (e.g. 9.0), got {text!r}") from None
    if major < 8 or minor < 0:
        raise ValueError(f"--cc {text}: torch_l2topo needs compute capability 8.0 or newer")
    return major, minor


def cmd_build(args) -> int:
    from .errors import DeviceError
    from .measure.extension import build_ahead

    if args.cc:
        archs = [_architecture(text) for text in args.cc]
    else:
        import torch

        if not torch.cuda.is_available():
            raise DeviceError("no CUDA GPU here to build for: name the architectures with --cc, e.g. --cc 9.0")
        archs = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
    for cc in dict.fromkeys(archs):  # each architecture once, in order
        build_ahead(cc, progress=lambda line: print(line, flush=True))
    print(f"built for {', '.join(f'sm_{a}{b}' for a, b in dict.fromkeys(archs))}: jobs load these extensions "
          f"without compiling")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m torch_l2topo",
                                description="Per-SM L2 latency maps of NVIDIA GPUs. Without a command: "
                                            "calibrate the local GPU, or show bundled data without one.",
                                epilog=EXIT_STATUS)
    p.add_argument("--version", action="version", version=f"torch_l2topo {__version__}")
    sub = p.add_subparsers(dest="command")
    c = sub.add_parser("calibrate", help="measure (or load from the cache) this GPU's map and summarize it")
    c.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    c.add_argument("--backend", choices=BACKEND_CHOICES, default="auto",
                   help="probe kernels: triton, cuda (C++ extension, built on first use) or auto (default: "
                        "triton where installed, else cuda)")
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
    s.add_argument("--example", help=f"bundled calibration to show (a name or a model: {_EXAMPLE_DEFAULT}); see "
                                     "`examples`")
    s.add_argument("--json", action="store_true",
                   help="print JSON (metadata, per-SM chain latency and clock, per-line mean) instead of the summary")
    s.set_defaults(func=cmd_show)
    r = sub.add_parser("report", help="analyse a calibration: Markdown report with PNG figures")
    r.add_argument("file", nargs="?", help="a saved calibration (.npz); default: a bundled example")
    r.add_argument("--example", help=f"bundled calibration to analyse (a name or a model: {_EXAMPLE_DEFAULT}); see "
                                     "`examples`")
    r.add_argument("--compare", help="a second calibration (.npz path or bundled name), usually of the same GPU: "
                                     "adds how partitions, clusters and slice classes hold between the two "
                                     "(another GPU's is compared too, and said to be another GPU)")
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
        else:
            f.epilog = "exit status: 0 match, 1 no match, 3 ambiguous, 2 error"
        f.add_argument("file", nargs="?", help="a saved calibration (.npz) or bundled name; default: calibrate "
                                               "this machine's GPU")
        f.add_argument("--device", type=int, default=None, help="CUDA device index when calibrating")
        f.add_argument("--registry", default=str(cache_dir() / "registry"),
                       help="registry directory (default: <calibration cache>/registry)")
        if verb == "identify":
            f.add_argument("--json", action="store_true", help="print the evidence as JSON")
        f.set_defaults(func=func)
    b = sub.add_parser("build", help="build the CUDA extensions (probe kernels, eager kernels) ahead of time, so that "
                                     "no job compiles them (they load in a fraction of a second once built)")
    b.add_argument("--cc", action="append", default=None, metavar="MAJOR.MINOR",
                   help="a GPU architecture to build for, e.g. 9.0 (repeatable; default: every local GPU's)")
    b.set_defaults(func=cmd_build)
    e = sub.add_parser("examples", help="list the bundled calibrations (real maps of each model), one line each")
    e.set_defaults(func=cmd_examples)
    g = sub.add_parser("geometry", help="measure the L2 geometry: line, capacity knees, hashing, contention, "
                                        "prefetching, persisting L2 (a GPU; quick: <= 20 s)")
    g.add_argument("--quick", action="store_true", help="short sweeps (<= 20 s on an H200; full: <= 3 min there)")
    g.add_argument("--device", type=int, default=None, help="CUDA device index (default: current)")
    g.add_argument("--out", help="also write every curve and derived number to this JSON file")
    g.add_argument("--figures", metavar="DIR", help="draw the main curves as PNGs into DIR (needs matplotlib)")
    g.add_argument("--from", dest="from_file", metavar="FILE",
                   help="summarize (and with --figures draw) a recorded geometry JSON instead of measuring")
    g.set_defaults(func=cmd_geometry)
    f = sub.add_parser("fleet", help="every GPU of a torchrun job: each rank calibrates its own, the job gathers one "
                                     "table with fingerprint distances and DCGM-style health lines "
                                     "(`torchrun --nproc_per_node=N -m torch_l2topo fleet`)")
    f.add_argument("--file", help="a saved calibration for this rank instead of calibrating ({rank} and {local_rank} "
                                  "are replaced: --file 'cal-{rank}.npz')")
    f.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                   help=f"seconds a rank may calibrate before it reports a timeout instead (default "
                        f"{DEFAULT_TIMEOUT_S:g}); joining the job and each gather wait at most {GATHER_SLACK_S:g} s "
                        "longer for the other ranks")
    f.add_argument("--identifiers", action="store_true", help="put raw GPU uuids and host names in the table")
    f.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    f.add_argument("--mode", choices=MODES, default=DEFAULT_MODE)
    f.add_argument("--force", action="store_true", help="measure even if a cached calibration exists")
    f.add_argument("--out", help="rank 0 also writes the fleet (table, distances, findings, health) to this JSON file")
    f.set_defaults(func=cmd_fleet)
    t = sub.add_parser("trace-summary", help="per instrumented kernel of a torch_l2topo profiler trace: SM busy time, "
                                             "tail, imbalance, slow-SM share, near share, placement estimate")
    t.add_argument("trace", help="a trace written by torch_l2topo.profile or its trace_handler (.json or .json.gz)")
    t.add_argument("--json", action="store_true", help="print JSON instead of the table")
    t.add_argument("--timeline", metavar="PNG", help="also draw the per-SM timeline of one launch (needs matplotlib)")
    t.add_argument("--kernel", help="the kernel whose launch --timeline draws (default: the first instrumented one; "
                                    "its launch with the longest tail)")
    t.set_defaults(func=cmd_trace_summary)
    return p


def _os_error_line(exc: OSError) -> str:
    """A file the command could not read or write, in one line (no errno, no traceback)."""
    if isinstance(exc, FileExistsError):
        return f"{exc.filename} exists and is not a directory"
    return f"{exc.filename}: {exc.strerror}" if exc.filename is not None and exc.strerror else str(exc)


def _stdout_gone() -> int:
    """The reader of stdout went away (`... | head`): stop quietly. Python flushes stdout again at exit; point it at
    /dev/null so that this flush cannot fail too."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return EXIT_PIPE_CLOSED


def run_script(main, *args) -> int:
    """An example's or script's entry: main(*args), then exit status 0, or EXIT_PIPE_CLOSED (quietly, no traceback)
    when its output pipe closed early (`python examples/x.py | head`), as the verbs do:
    `sys.exit(run_script(main, sys.argv[1:]))`."""
    try:
        main(*args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
    except BrokenPipeError:
        return _stdout_gone()
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    func = getattr(args, "func", cmd_main_job)
    try:
        status = func(args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        return status
    except BrokenPipeError:
        return _stdout_gone()
    except (L2TopoError, ValueError) as exc:
        print(f"torch_l2topo: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except OSError as exc:
        print(f"torch_l2topo: error: {_os_error_line(exc)}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
