"""docs/layout.md's table against the tree: every file of the package and of the kernel folders has a row,
every file a row names exists, and the README points to the table instead of keeping a copy that drifts."""
import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "layout.md"
COVERED = ("torch_l2topo", "triton_kernels", "cuda_ext")  # the folders whose every file the table must name


def tree_files(root: Path = ROOT) -> set:
    """Every file under the covered folders (caches left out), as paths relative to `root`."""
    return {p.relative_to(root).as_posix() for top in COVERED for p in (root / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"}


def table_rows(text: str) -> list:
    """(folder, [file names or globs]) of every table row whose first cell is a backticked folder."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.fullmatch(r"`[^`]+/`", cells[0]):
            rows.append((cells[0].strip("`"), re.findall(r"`([^`]+)`", cells[1])))
    return rows


def check(text: str, files: set) -> list:
    """What is wrong between the table and the tree: names that match no file, files no row names."""
    problems, named = [], set()
    for folder, names in table_rows(text):
        if not names:
            problems.append(f"row of {folder} names no file")
        for name in names:
            if "/" in name:
                problems.append(f"{folder}: name files relative to the row's folder, not {name}")
            hits = {f for f in files if f.rsplit("/", 1)[0] + "/" == folder
                    and fnmatch.fnmatchcase(f.rsplit("/", 1)[1], name)}
            if not hits:
                problems.append(f"{folder}{name} is in docs/layout.md but not in the tree")
            named |= hits
    problems += [f"{f} has no row in docs/layout.md" for f in sorted(files - named)]
    return problems


def test_the_layout_table_names_every_file_and_only_files_that_exist():
    assert not check(DOC.read_text(), tree_files()), "\n".join(check(DOC.read_text(), tree_files()))


def test_the_check_sees_a_new_file_and_a_stale_row():
    files = {"torch_l2topo/a.py", "torch_l2topo/b.py", "torch_l2topo/data/x.npz"}
    table = ("| folder | files | owns |\n|---|---|---|\n| `torch_l2topo/` | `a.py`, `gone.py` | x |\n"
             "| `torch_l2topo/data/` | `*.npz` | y |\n")
    assert check(table, files) == ["torch_l2topo/gone.py is in docs/layout.md but not in the tree",
                                   "torch_l2topo/b.py has no row in docs/layout.md"]
    assert check(table.replace("`gone.py`", "`b.py`"), files) == []
    assert check(table.replace("`*.npz`", "`*.json`"), files)  # a glob matching nothing is a stale row too


def test_the_layout_table_covers_every_folder_of_the_package():
    folders = {folder for folder, _ in table_rows(DOC.read_text())}
    packages = {p.parent.relative_to(ROOT).as_posix() + "/" for top in COVERED
                for p in (ROOT / top).rglob("__init__.py")}
    assert packages <= folders, sorted(packages - folders)


def test_readme_points_to_the_layout_doc_instead_of_a_table():
    readme = (ROOT / "README.md").read_text()
    assert "(docs/layout.md)" in readme
    assert not any(row for row in table_rows(readme)), "the layout table lives in docs/layout.md only"
