"""Every benchmark script still runs, on CPU: each command-line script of benchmarks/ and benchmarks/diagnose/
answers `python benchmarks/X.py --help` with its usage and exit status 0 (so its imports, the package's names it
uses included, resolve and its arguments parse), each helper module imports, and each shell script passes
`bash -n`. The GPU runs themselves are the lead's (benchmarks/run_h200_suite.sh)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
SCRIPTS = sorted(BENCH.glob("*.py")) + sorted(BENCH.glob("diagnose/*.py"))
SHELL = sorted(BENCH.glob("*.sh"))


def _is_entry_point(path: Path) -> bool:
    return 'if __name__ == "__main__":' in path.read_text()


def _env() -> dict:
    env = dict(os.environ)  # this checkout's package first, as the scripts run from it
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["CUDA_VISIBLE_DEVICES"] = ""  # CPU, even on a machine with a GPU: --help must not need one
    return env


@pytest.fixture(scope="module")
def ran() -> dict:
    """{script name: (exit status, output)}: every script through tests/script_runner.py, which makes the heavy
    imports once and runs each script in a forked child as `python benchmarks/X.py --help` would."""
    cmd = [sys.executable, str(Path(__file__).with_name("script_runner.py"))]
    for path in SCRIPTS:
        cmd += [str(path)] if _is_entry_point(path) else ["--import", str(path)]
    out = subprocess.run([*cmd, "--", "--help"], cwd=BENCH, env=_env(), capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return {r["script"]: (r["status"], r["output"]) for r in rows}


def test_script_names_are_unique():
    assert len({p.name for p in SCRIPTS}) == len(SCRIPTS), "the runner reports scripts by file name"


def test_there_are_scripts_of_both_kinds():
    assert sum(map(_is_entry_point, SCRIPTS)) >= 10 and not all(map(_is_entry_point, SCRIPTS)) and SHELL


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.relative_to(BENCH).as_posix())
def test_every_benchmark_script_answers_help_or_imports(ran, path):
    assert path.name in ran, f"{path.name} did not run"
    rc, out = ran[path.name]
    assert rc == 0, out[-3000:]
    if _is_entry_point(path):
        assert out.startswith("usage:"), out[:500]


@pytest.mark.parametrize("path", SHELL, ids=lambda p: p.name)
def test_shell_scripts_parse(path):
    out = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_the_runner_reports_a_broken_script(tmp_path):
    """The runner's negative fixture: a script whose import fails, and one that exits 3, are not reported as 0."""
    (tmp_path / "broken.py").write_text("import a_module_that_does_not_exist\n")
    (tmp_path / "three.py").write_text('import sys\nif __name__ == "__main__":\n    sys.exit(3)\n')
    runner = str(Path(__file__).with_name("script_runner.py"))
    out = subprocess.run([sys.executable, runner, str(tmp_path / "broken.py"), str(tmp_path / "three.py"), "--",
                          "--help"], env=_env(), capture_output=True, text=True, timeout=300)
    got = {r["script"]: r for r in map(json.loads, out.stdout.splitlines())}
    assert got["broken.py"]["status"] == 1 and "ModuleNotFoundError" in got["broken.py"]["output"]
    assert got["three.py"]["status"] == 3
