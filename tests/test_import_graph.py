"""The import graph: data flows one way, kernels -> measure -> Topology -> analysis -> uses -> CLI.

The package has one folder per role, and each folder may import only the folders its rule below names
(function-level imports included), so "what may this file import?" is answered by where it sits:

    root (errors, layout, version, files, labelings, device, topology, bundled)   the shared vocabulary: root only
    measure/     kernels launched to measure the L2: root
    analysis/    explains a saved map on the CPU: root (never measure/: it must run without a GPU)
    placement/   plans, @sm_aware, partition maps, green contexts: root, measure, analysis
    identity/    fingerprints, registry, self-localization: root, measure, analysis
    geometry/    the L2 geometry suite: root, measure, analysis, placement (partition maps)
    report/      the Markdown report and figures: root, analysis, geometry
    profiler/    the torch.profiler hook: root, measure, analysis, placement
    ops/         latency-bound ops for model code: root, measure, analysis, placement
    distributed/ fleets of a torch.distributed job, their health view: root, measure, analysis, identity
    entry points (__init__, __main__, cli)   anything

The kernel folders import only the layout module from the package; nobody imports another module's private
names; imports have no cycles, function-level ones included (a lazy import that closes a circle hides it rather
than breaking it), in the package and among the benchmark scripts. A new folder or root module must be given its
rule here.
"""
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "torch_l2topo"

FOUNDATION = {"errors", "layout", "version", "files", "labelings", "device", "topology", "bundled"}
ENTRY = {"__init__", "__main__", "cli"}
MAY_IMPORT = {
    "root": {"root"},
    "measure": {"root"},
    "analysis": {"root"},
    "placement": {"root", "measure", "analysis"},
    "identity": {"root", "measure", "analysis"},
    "geometry": {"root", "measure", "analysis", "placement"},
    "report": {"root", "analysis", "geometry"},
    "profiler": {"root", "measure", "analysis"},
    "ops": {"root", "measure", "analysis", "placement"},
    "distributed": {"root", "measure", "analysis", "identity"},
}
KERNEL_FOLDERS = {"triton_kernels", "cuda_ext"}


def _imports(path: Path, package: str) -> list[tuple[str, list[str], bool]]:
    """(module imported, names imported, at module level?) for every import statement of a file."""
    tree = ast.parse(path.read_text())
    top = set(map(id, tree.body))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, [], id(node) in top) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            out.append((mod, [a.name for a in node.names], id(node) in top))
    return out


def _module_name(path: Path) -> str:
    """Dotted name below the package: "cli", "measure.probes", "placement" (a folder's __init__)."""
    parts = path.relative_to(PKG).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" and len(parts) > 1 else parts)


def _room(module: str) -> str:
    """The folder rule a module obeys: its folder, "root" for the shared vocabulary, "entry" for the entry
    points."""
    if "." in module or (PKG / module).is_dir():
        return module.split(".")[0]
    return "entry" if module in ENTRY else "root"


def _target(mod: str, name: str | None) -> str | None:
    """The package module an import reaches (None: outside the package or a kernel folder)."""
    if not mod.startswith("torch_l2topo"):
        return None
    rest = mod.split(".")[1:]
    if name is not None and ((PKG.joinpath(*rest, f"{name}.py")).exists() or (PKG.joinpath(*rest, name)).is_dir()):
        rest = [*rest, name]
    if not rest or rest[0] in KERNEL_FOLDERS:
        return None
    return ".".join(rest)


def _package_edges():
    """(importer, imported module, at module level?, names) for every import inside the package."""
    edges = []
    for path in sorted(PKG.rglob("*.py")):
        importer = _module_name(path)
        package = ".".join(["torch_l2topo", *path.relative_to(PKG).parts[:-1]])
        for mod, names, top in _imports(path, package):
            targets = {_target(mod, n) for n in names} if names else {_target(mod, None)}
            edges += [(importer, t, top, names) for t in targets if t is not None and t != importer]
    return edges


def test_every_folder_and_root_module_has_a_rule():
    rooms = {_room(_module_name(p)) for p in PKG.rglob("*.py")}
    assert rooms - {"entry"} <= set(MAY_IMPORT), f"give these folders a rule: {sorted(rooms - set(MAY_IMPORT))}"
    stray = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in FOUNDATION | ENTRY)
    assert not stray, f"root modules must be shared vocabulary or entry points; move these into a folder: {stray}"


def test_imports_follow_the_folder_rules():
    bad = [(a, b) for a, b, _, _ in _package_edges()
           if _room(a) != "entry" and _room(b) != _room(a) and _room(b) not in MAY_IMPORT[_room(a)]]
    assert not bad, f"imports against the data flow: {bad}"


def test_the_rule_check_sees_a_violation():
    # analysis/ must never reach measure/: an edge that does is exactly what the check reports.
    a, b = "analysis.nuca", "measure.probes"
    assert _room(a) == "analysis" and _room(b) == "measure" and _room(b) not in MAY_IMPORT[_room(a)]
    assert _room("cli") == "entry" and _room("topology") == "root" and _room("placement") == "placement"


def test_the_profilers_trace_format_stands_apart_from_its_processes():
    """profiler/trace (the trace format and its enrichment: pure numpy and JSON) imports nothing of profiler/runtime
    (processes, shared memory, GPU hand-offs) or the session; runtime may use the format."""
    edges = _package_edges()
    assert any(a.startswith("profiler.runtime") and b.startswith("profiler.trace") for a, b, _, _ in edges)
    bad = [(a, b) for a, b, _, _ in edges if a.startswith("profiler.trace") and b.startswith("profiler")
           and not b.startswith("profiler.trace")]
    assert not bad, f"the trace format reaches the profiler's processes: {bad}"


def test_no_private_names_cross_modules():
    def private(name):
        return name.startswith("_") and not name.endswith("__")

    bad = [(a, b, n) for a, b, _, names in _package_edges() for n in names if private(n)]
    for folder in KERNEL_FOLDERS:
        for path in (ROOT / folder).glob("*.py"):
            for mod, names, _ in _imports(path, f"torch_l2topo.{folder}"):
                bad += [(path.name, mod, n) for n in names if private(n)]
    assert not bad, bad


@pytest.mark.parametrize("folder", sorted(KERNEL_FOLDERS))
def test_kernel_folders_import_only_the_layout(folder):
    allowed = {"torch_l2topo.layout", f"torch_l2topo.{folder}"}
    for path in (ROOT / folder).glob("*.py"):
        for mod, names, _ in _imports(path, f"torch_l2topo.{folder}"):
            targets = [f"{mod}.{n}" for n in names] if mod == "torch_l2topo" else [mod]
            for target in targets:
                if target.startswith("torch_l2topo"):
                    assert target in allowed or target.startswith(f"torch_l2topo.{folder}."), (path.name, target)


def _cycle(graph: dict) -> list | None:
    """One import cycle of graph ({module: modules it imports}) as [a, b, ..., a], or None."""
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack + [node, nxt]
            found = visit(nxt, stack + [node]) if nxt not in state else None
            if found:
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        found = visit(node, []) if node not in state else None
        if found:
            return found[found.index(found[-1]):]
    return None


def _graph(edges) -> dict:
    graph = {}
    for a, b in edges:
        if a != b:
            graph.setdefault(a, set()).add(b)
    return graph


def _script_edges(folders) -> list:
    """(importer, imported) among the script modules of `folders` (benchmarks/ and its subfolders), every import
    statement of a file counted wherever it sits: a module found in the importer's folder or in benchmarks/ (where
    the scripts put themselves on sys.path)."""
    files = {p.stem: p for folder in folders for p in sorted(folder.glob("*.py"))}
    edges = []
    for name, path in files.items():
        for mod, _, _ in _imports(path, ""):
            target = (mod or "").split(".")[0]
            if (path.parent / f"{target}.py").is_file() or (folders[0] / f"{target}.py").is_file():
                edges.append((name, target))
    return edges


def test_module_level_imports_have_no_cycle():
    cycle = _cycle(_graph((a, b) for a, b, top, _ in _package_edges() if top))
    assert cycle is None, f"import cycle: {' -> '.join(cycle)}"


def test_imports_have_no_cycle_even_through_function_level_imports():
    cycle = _cycle(_graph((a, b) for a, b, _, _ in _package_edges()))
    assert cycle is None, f"import cycle (a lazy import closes it): {' -> '.join(cycle)}"


def test_benchmark_scripts_import_each_other_without_a_cycle():
    bench = ROOT / "benchmarks"
    edges = _script_edges([bench, *sorted(p for p in bench.iterdir() if p.is_dir() and any(p.glob("*.py")))])
    assert ("bench_profiler", "common") in edges  # the check sees the scripts' imports
    cycle = _cycle(_graph(edges))
    assert cycle is None, f"import cycle among the benchmarks: {' -> '.join(cycle)}"


def test_the_cycle_check_sees_a_cycle_closed_by_a_lazy_import(tmp_path):
    """Negative fixture: b imports a inside a function, a imports b at the top (the shape of the two circles
    issue 45 broke); and a cycle of three."""
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    from a import x\n    return x\n")
    (tmp_path / "c.py").write_text("import a\n")
    edges = _script_edges([tmp_path])
    assert sorted(edges) == [("a", "b"), ("b", "a"), ("c", "a")]
    assert _cycle(_graph(edges)) in (["a", "b", "a"], ["b", "a", "b"])
    assert _cycle(_graph([("x", "y"), ("y", "z"), ("z", "x"), ("w", "x")])) == ["x", "y", "z", "x"]
    assert _cycle(_graph([("x", "y"), ("y", "z"), ("w", "x")])) is None


def test_the_package_and_its_trace_workers_import_without_torch_or_scipy():
    # a trace worker process imports this much before its first job; torch and scipy would add seconds per worker
    probe = ("import sys, torch_l2topo, torch_l2topo.profiler.runtime.worker, torch_l2topo.profiler.runtime.cycle; "
             "print(sorted(m for m in ('torch', 'scipy', 'pandas', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
