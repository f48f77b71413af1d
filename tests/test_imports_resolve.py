"""Every import statement in the repository resolves: the package, the kernel folders, tests, benchmarks and
examples, including the imports that sit inside functions (many on GPU-only paths that CPU CI never runs).

Checked statically, without importing anything: an import of the package must name a module that exists
(torch_l2topo.triton_kernels and torch_l2topo.cuda_ext live in the top-level kernel folders) and every name
taken from it must be defined at its top level (or be a submodule, or a lazy name of a module-level
__getattr__, listed in its __all__); a test or benchmark may import its sibling files; any other import must
be an installed distribution, or one of the optional dependencies below, each with the reason it may be
missing on a CPU machine.
"""
import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "torch_l2topo"
KERNEL_FOLDERS = {"triton_kernels", "cuda_ext"}
# Optional dependencies (pyproject extras or measurement-only tools) whose absence a caller handles.
OPTIONAL = {
    "cuda": "cuda-python, the [green] extra: green contexts and the driver API of the geometry suite",
    "pynvml": "nvidia-ml-py, the [nvml] extra: clock setting and board serial",
    "matplotlib": "the [plots] extra: report figures",
    "sklearn": "scikit-learn: forest models for forest_predict and its benchmarks",
    "xgboost": "xgboost: forest models for forest_predict and its benchmarks",
    "hummingbird": "hummingbird-ml: the forest baseline of the ops benchmark",
    "hta": "holistictraceanalysis: the trace consumer the profiler is checked against",
}
SCRIPT_FOLDERS = ("tests", "benchmarks", "benchmarks/diagnose", "examples")
SOURCES = sorted([*(ROOT / PACKAGE).rglob("*.py"),
                  *(p for folder in (*KERNEL_FOLDERS, *SCRIPT_FOLDERS) for p in (ROOT / folder).glob("*.py"))])


def module_file(dotted: str) -> Path | None:
    """The source file of a package module (a package's __init__.py), or None."""
    parts = dotted.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT / parts[1] if len(parts) > 1 and parts[1] in KERNEL_FOLDERS else ROOT / PACKAGE
    rest = parts[2:] if len(parts) > 1 and parts[1] in KERNEL_FOLDERS else parts[1:]
    path = base.joinpath(*rest)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def package_of(path: Path) -> str | None:
    """The dotted package a source file's relative imports are resolved against (None: a script folder)."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] in KERNEL_FOLDERS:
        return f"{PACKAGE}.{rel.parts[0]}"
    if rel.parts[0] == PACKAGE:
        return ".".join(rel.parts[:-1])
    return None


def top_level_names(path: Path) -> set:
    """Names a module defines at its top level, plus its __all__ where it has a module __getattr__ (lazy)."""
    tree = ast.parse(path.read_text())
    names, lazy, exported = set(), False, set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            lazy |= node.name == "__getattr__"
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(t, ast.Name) and t.id == "__all__" and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported = {e.value for e in node.value.elts if isinstance(e, ast.Constant)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # `try: import x except ImportError: x = None`
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    names.add(sub.id)
    return names | exported if lazy else names


def script(name: str, importer: Path) -> Path | None:
    """The file of script module `name` seen from `importer`: its own folder first, then the benchmarks and the
    diagnoses (tests put those folders on sys.path to test a benchmark's helpers)."""
    for folder in (importer.parent, ROOT / "benchmarks", ROOT / "benchmarks" / "diagnose"):
        if (folder / f"{name}.py").is_file():
            return folder / f"{name}.py"
    return None


def imports(path: Path, package: str | None):
    """(line, absolute module, names taken from it) of every import statement in a file whose relative
    imports resolve against `package`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name, []
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert package, f"{path}:{node.lineno}: a relative import outside the package"
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module
            yield node.lineno, module, [a.name for a in node.names if a.name != "*"]


def unresolved(path: Path, package: str | None) -> list:
    """"line: what is wrong" for every import of `path` that does not resolve."""
    bad = []
    for line, module, names in imports(path, package):
        top = module.split(".")[0]
        if top == PACKAGE:
            file = module_file(module)
            if file is None:
                bad.append(f"{line}: no module {module}")
                continue
            defined = top_level_names(file)
            bad += [f"{line}: {module} has no {n}" for n in names
                    if n not in defined and module_file(f"{module}.{n}") is None]
        elif package is None and script(top, path):  # a sibling file, or a benchmark a test imports
            defined = top_level_names(script(top, path))
            bad += [f"{line}: {top} has no {n}" for n in names if n not in defined]
        elif top not in OPTIONAL and importlib.util.find_spec(top) is None:
            bad.append(f"{line}: {module} is not installed and not a declared optional dependency")
    return bad


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_import_resolves(path):
    assert not unresolved(path, package_of(path))


def test_the_checker_sees_broken_imports(tmp_path):
    # A package file importing a module that does not exist, a name its module lacks and a misspelt
    # dependency (inside a function): three findings; the one good import is not among them.
    path = tmp_path / "fixture.py"
    path.write_text("from .no_such_module import x\n"
                    "from .errors import NoSuchError\n"
                    "def f():\n    import numpyy\n"
                    "from .errors import L2TopoError\n")
    assert unresolved(path, PACKAGE) == [f"1: no module {PACKAGE}.no_such_module",
                                         f"2: {PACKAGE}.errors has no NoSuchError",
                                         "4: numpyy is not installed and not a declared optional dependency"]


def test_every_subpackage_is_reachable_after_a_plain_import():
    """The docs write torch_l2topo.profiler.trace_handler(...) and torch_l2topo.ops.embedding_bag(...) after a plain
    `import torch_l2topo`: each subpackage is an attribute, imported on first use, in a fresh interpreter."""
    import subprocess
    import sys

    import torch_l2topo

    code = ("import torch_l2topo as t; t.profiler.trace_handler; t.ops.embedding_bag; "
            + "; ".join(f"t.{name}" for name in torch_l2topo.SUBPACKAGES))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
