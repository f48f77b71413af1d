"""Append the rows of benchmark result files to their tables: for runs made where the table is not (a device
machine whose output was copied back), or made before the tables existed.

Each file is a benchmark's result JSON ({"command", "env", "figures"[, "commit"]}); its command names the script
that wrote it (bench_*.py, run_geometry.py), whose TABLE and table_rows() give the table and the rows. Rows
already in the table (the same run) are skipped, so a file tabulated twice adds nothing.

    python benchmarks/tabulate_runs.py RESULT.json [RESULT.json ...] [--table-dir benchmarks/results]
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
from pathlib import Path

from common import RESULTS, append_rows

SCRIPT = re.compile(r"(?:^|[\s/])(bench_\w+|run_geometry)\.py(?:\s|$)")


def script_of(command: str) -> str | None:
    """The benchmark module a result's command ran ("bench_ops" for "python bench_ops.py --out ..."), or None."""
    found = SCRIPT.search(command or "")
    return found.group(1) if found else None


def tabulate(path, table_dir=RESULTS) -> tuple:
    """(table, rows appended) for one result file; ValueError if its command names no benchmark with a table."""
    doc = json.loads(Path(path).read_text())
    name = script_of(doc.get("command"))
    module = importlib.import_module(name) if name else None
    if not hasattr(module, "table_rows"):
        raise ValueError(f"{path}: its command ({doc.get('command')!r}) names no benchmark that keeps a table")
    rows = module.table_rows(doc["figures"])
    commit = doc.get("commit") or doc["env"].get("commit")
    return module.TABLE, append_rows(module.TABLE, rows, doc["env"], doc["command"], commit, table_dir)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("paths", nargs="+", help="result JSON files")
    p.add_argument("--table-dir", default=str(RESULTS), help="where the tables are")
    args = p.parse_args(argv)
    for path in args.paths:
        table, n = tabulate(path, args.table_dir)
        print(f"{path}: {n} rows appended to {table}.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
