"""Run many Python scripts as `python SCRIPT ARGS...` would, in one process, for tests/test_benchmark_scripts.py.

Importing torch, Triton, numpy, scipy, pandas and the package costs seconds per process on a CI machine; here
they are imported once, then each script runs in a forked child (Linux) as __main__, with its own sys.argv and
its folder first on sys.path, its output captured. A script named after --import is imported instead (a helper
module).
Prints one JSON line per script: {"script", "status", "output"}.

    python tests/script_runner.py [--import] SCRIPT ... -- ARGS...
"""
from __future__ import annotations

import json
import os
import sys
import tempfile


def run_one(path: str, args: list, as_import: bool) -> tuple:
    """(exit status, output) of one script, run in a forked child."""
    with tempfile.TemporaryFile(mode="w+") as out:
        pid = os.fork()
        if pid == 0:  # the child: the script, its output into `out`, then exit with its status
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            sys.stdout = os.fdopen(1, "w", buffering=1)
            sys.stderr = os.fdopen(2, "w", buffering=1)
            status = _child(path, args, as_import)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(status)
        _, wait_status = os.waitpid(pid, 0)
        out.seek(0)
        return os.waitstatus_to_exitcode(wait_status), out.read()


def _child(path: str, args: list, as_import: bool) -> int:
    import importlib
    import runpy
    import traceback

    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    try:
        if as_import:
            importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        else:
            runpy.run_path(path, run_name="__main__")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main(argv: list) -> int:
    scripts, args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    import importlib

    # the heavy imports, once, before forking: what every script pays for before its own code runs
    for module in ("numpy", "scipy.optimize", "scipy.cluster.hierarchy", "pandas", "torch", "triton.language",
                   "torch_l2topo"):
        try:
            importlib.import_module(module)
        except ImportError:
            pass
    as_import = False
    for item in scripts:
        if item == "--import":
            as_import = True
            continue
        status, output = run_one(item, [] if as_import else args, as_import)
        print(json.dumps({"script": os.path.basename(item), "status": status, "output": output}), flush=True)
        as_import = False
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
