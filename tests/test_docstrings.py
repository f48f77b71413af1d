"""The package's source says what it owns, not what a run measured: no module docstring over MAX_LINES lines
under torch_l2topo/, triton_kernels/ and cuda_ext/, and no `benchmarks/results` path in any file there (the
evidence lives in docs/, the figures in docs/results.md)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("torch_l2topo", "triton_kernels", "cuda_ext")
MAX_LINES = 15
RESULTS = "benchmarks/results"
TEXT_SUFFIXES = (".py", ".cu", ".cuh", ".h", ".cpp")  # the bundled calibrations (*.npz) are data, not source
LONG, CITES = f"module docstring over {MAX_LINES} lines", f"cites {RESULTS}"

def docstring_lines(source: str) -> int:
    """Lines of a module's docstring as written (0 without one), counted from the opening quotes' line."""
    doc = ast.get_docstring(ast.parse(source), clean=False)
    return 0 if doc is None else len(doc.splitlines())


def problems(source: str, suffix: str) -> set:
    """What a source file breaks: LONG (a Python module docstring over MAX_LINES lines), CITES (a results path)."""
    found = set()
    if suffix == ".py" and docstring_lines(source) > MAX_LINES:
        found.add(LONG)
    if RESULTS in source:
        found.add(CITES)
    return found


def source_files(root: Path = ROOT) -> dict:
    """{relative path: problems} of every source file under FOLDERS."""
    return {p.relative_to(root).as_posix(): problems(p.read_text(), p.suffix)
            for top in FOLDERS for p in sorted((root / top).rglob("*"))
            if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts}


def test_no_long_module_docstring_and_no_results_path():
    bad = {path: sorted(found) for path, found in source_files().items() if found}
    assert not bad, f"trim these (module docstrings <= {MAX_LINES} lines, evidence in docs/): {bad}"


@pytest.mark.parametrize("n_lines, expected", [(MAX_LINES, set()), (MAX_LINES + 1, {LONG})])
def test_the_line_limit_can_fail(n_lines, expected):
    """Negative fixture: a docstring of MAX_LINES lines passes, one line more fails; counted as written."""
    body = "\n".join(f"line {i}" for i in range(1, n_lines))
    source = f'"""Title.\n{body}\n"""\nx = 1\n'
    assert docstring_lines(source) == n_lines
    assert problems(source, ".py") == expected


def test_the_results_check_can_fail():
    """Negative fixture: a results path in a comment fails in any source file; a docs path passes."""
    assert problems('"""Short."""\n# see ' + RESULTS + "/x.json\n", ".py") == {CITES}
    assert problems("// " + RESULTS + "/x.json\n", ".cu") == {CITES}
    assert problems('"""Short."""\n# see docs/results.md\n', ".py") == set()
    assert docstring_lines("x = 1\n") == 0
