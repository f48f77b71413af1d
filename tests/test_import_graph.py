"""The import graph: data flows one way, kernels -> probes -> Topology -> analysis -> uses -> CLI.

Every package module sits in a layer and imports only from its own or lower layers (function-level imports
included); the analysis layer, which must run on a CPU from a saved Topology, imports nothing that launches
kernels; the kernel folders import only the layout module from the package; nobody imports another module's
private names; module-level imports have no cycles. A new module must be given a layer here.
"""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "torch_l2topo"

LAYERS = [
    ("foundation", {"errors", "layout", "version", "files", "labelings"}),
    ("data", {"device", "topology", "cache", "bundled", "probe_plans"}),
    ("launch", {"launch", "extension"}),
    ("probes", {"probes", "oracles", "gpc_probe"}),
    ("calibration", {"calibration", "trust", "repeats"}),
    ("analysis", {"nuca", "labels", "structure", "slices", "compare", "analysis", "geometry"}),
    ("uses", {"localize", "selfloc", "fingerprint", "fingerprint_eval", "registry", "hashed", "plans", "launcher",
              "sm_aware", "partition_map", "green_contexts"}),
    ("suites", {"geometry_probes"}),  # a use of the uses: calibration, partition maps, slice classes
    ("presentation", {"report", "figures", "geometry_figures", "cli", "__init__", "__main__"}),
]
LAYER = {m: i for i, (_, mods) in enumerate(LAYERS) for m in mods}
GPU_SIDE = {"launch", "extension", "probes", "oracles", "gpc_probe", "calibration"}
KERNEL_FOLDERS = {"triton_kernels": "triton_kernels", "cuda_ext": "cuda_ext"}


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


def _package_edges():
    edges = []
    for path in sorted(PKG.glob("*.py")):
        for mod, names, top in _imports(path, "torch_l2topo"):
            if mod == "torch_l2topo" and names:  # `from . import layout`
                edges += [(path.stem, n, top, []) for n in names if (PKG / f"{n}.py").exists()]
            elif mod.startswith("torch_l2topo."):
                target = mod.split(".")[1]
                if target not in KERNEL_FOLDERS:
                    edges.append((path.stem, target, top, names))
    return edges


def test_every_module_has_a_layer():
    missing = sorted(p.stem for p in PKG.glob("*.py") if p.stem not in LAYER)
    assert not missing, f"give these modules a layer in tests/test_import_graph.py: {missing}"


def test_imports_go_down_the_layers():
    up = [(a, b) for a, b, _, _ in _package_edges() if LAYER[b] > LAYER[a]]
    assert not up, f"imports against the data flow: {up}"


def test_analysis_never_touches_the_gpu_side():
    analysis = LAYERS[5][1]
    bad = [(a, b) for a, b, _, _ in _package_edges() if a in analysis and b in GPU_SIDE]
    assert not bad, bad


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


def test_module_level_imports_have_no_cycle():
    graph = {}
    for a, b, top, _ in _package_edges():
        if top and a != b:
            graph.setdefault(a, set()).add(b)
    state = {}

    def visit(node, stack):
        state[node] = "open"
        for nxt in graph.get(node, ()):
            if state.get(nxt) == "open":
                raise AssertionError(f"import cycle: {' -> '.join(stack + [node, nxt])}")
            if nxt not in state:
                visit(nxt, stack + [node])
        state[node] = "done"

    for node in list(graph):
        if node not in state:
            visit(node, [])
