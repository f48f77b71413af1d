"""README.md and docs/*.md: the first screen keeps its shape, every link and cited file exists, and the output
the README shows is what the commands print today. Every docs page shares one navigation line and opens with what
it is for and an example; usage.md lists every verb and option of the CLI's own parser; results.md has one table
per GPU model with the same rows, each figure linked to its file, and short cells."""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
FIRST_SCREEN_LINES = 40

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CPU_WHEEL = "python3 -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
CODE = re.compile(r"`([^`\n]+)`")
# A cited repository path: starts at one of the repository's top-level folders or files
CITED = re.compile(r"^(?:benchmarks|docs|examples|tests|torch_l2topo|triton_kernels|cuda_ext|\.ci)/[\w./*<>-]*$"
                   r"|^(?:README\.md|pyproject\.toml)$")


def _slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set:
    return {_slug(line.lstrip("#")) for line in page.read_text().splitlines() if line.startswith("#")}


def _words(text: str) -> int:
    """Words a reader sees: a link counts by its text, not its target."""
    return len(re.sub(r"\]\([^)]*\)", "]", text).split())


def _prose(page: Path) -> str:
    """The page without its fenced code blocks (commands there name files that runs create)."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    for target in LINK.findall(_prose(page)):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL: not checked offline
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        assert file.exists(), f"{page.name}: link to a missing file {target}"
        if anchor:
            assert file.suffix == ".md" and anchor in _anchors(file), f"{page.name}: no heading for #{anchor}"


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_cited_file_exists(page):
    for path in [c for c in CODE.findall(_prose(page)) if CITED.match(c)]:
        if "<" in path:
            continue  # a pattern such as results/noise/noise_h200_<uuid>.json
        assert list(ROOT.glob(path)) if "*" in path else (ROOT / path).exists(), f"{page.name} cites {path}"


def test_the_checks_above_can_fail(tmp_path):
    """Negative fixture: a page with a broken link, a missing anchor and a missing cited file."""
    page = tmp_path / "page.md"
    page.write_text("# Title\n[gone](nothing/here.md) [self](#title) [bad](#nope) `benchmarks/results/none.json`\n")
    targets = LINK.findall(_prose(page))
    assert targets == ["nothing/here.md", "#title", "#nope"]
    assert not (page.parent / targets[0]).exists() and "title" in _anchors(page) and "nope" not in _anchors(page)
    assert [c for c in CODE.findall(_prose(page)) if CITED.match(c)] == ["benchmarks/results/none.json"]
    assert not (ROOT / "benchmarks/results/none.json").exists()


def test_readme_starts_with_the_two_commands_ci_runs():
    lines = README.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1] == "" and lines[2] == "```bash" and lines[5] == "```"
    main_job, tests = lines[3], lines[4]
    assert main_job.endswith("python3 -m pip install -e . && python3 -m torch_l2topo")
    assert tests.endswith("python3 -m pytest -q")
    assert tests in (ROOT / ".ci" / "run").read_text().splitlines(), ".ci/run must run the README's test command"


def test_readme_gives_the_cpu_wheel_line_and_the_cuda_warning_right_after_the_two_commands():
    """A CPU-only user reads, before anything else, that plain pip pulls the multi-GB CUDA build, and the line
    that avoids it."""
    lines = README.read_text().splitlines()
    block = lines.index("```bash", 6)
    assert block <= 10, f"the CPU wheel's block starts on line {block + 1}, not right after the two commands"
    after = lines[6:block + 3]
    prose = " ".join(after)
    assert "CUDA build" in prose and "GB" in prose, "the CUDA wheel's size is not warned about after the commands"
    assert after[-2] == CPU_WHEEL, f"the first block after the two commands is not the CPU wheel line: {after[-2]}"
    assert after[-3] == "```bash" and after[-1] == "```"


def test_first_screen_has_purpose_commands_picture_and_a_few_short_measured_results():
    lines = README.read_text().splitlines()
    tour = next(i for i, line in enumerate(lines) if line.startswith("## "))
    assert tour <= FIRST_SCREEN_LINES, f"the first screen takes {tour} lines"
    screen = "\n".join(lines[:tour])
    pictures = re.findall(r"!\[[^\]]+\]\(([^)]+\.png)\)", screen)
    assert len(pictures) == 1 and (ROOT / pictures[0]).exists()
    results = [line for line in lines[:tour] if line.startswith("- **")]
    assert 4 <= len(results) <= 6, f"{len(results)} results on the first screen"
    for line in results:
        assert re.search(r"\d", line.split(":**", 1)[1]), f"no measured number: {line}"
        cited = re.findall(r"\]\(((?:benchmarks/results|tests/data)/[^)]+\.jsonl?)\)", line)
        assert cited and all((ROOT / c).exists() for c in cited), f"no result file cited: {line}"
        assert _words(line) <= 30, f"not a short bullet ({_words(line)} words): {line}"
    ops = next(line for line in results if "embedding_bag" in line)
    assert "kernel's, not the map's" in ops, "the ops' bullet must say their win is the kernel's, not the map's"


def _block_after(marker: str) -> list[str]:
    """The lines of the first ```text block that starts with `marker` in the README."""
    text = README.read_text()
    start = text.index("```text\n" + marker) + len("```text\n")
    return text[start:text.index("```", start)].rstrip("\n").splitlines()


def test_readme_shows_what_the_main_job_prints_without_a_gpu(capsys, monkeypatch):
    import torch

    from torch_l2topo.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main([]) == 0
    shown = _block_after("$ python3 -m torch_l2topo\n")
    assert shown[0] == "$ python3 -m torch_l2topo" and shown[1:] == capsys.readouterr().out.rstrip("\n").splitlines()


def test_readme_shows_what_the_placement_example_prints_without_a_gpu(capsys, monkeypatch):
    import importlib.util

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    spec = importlib.util.spec_from_file_location("plan_placement", ROOT / "examples" / "plan_placement.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    printed = capsys.readouterr().out.rstrip("\n").splitlines()
    assert _block_after(printed[0]) == printed


def test_readme_shows_what_trace_summary_prints_on_the_sample_trace(capsys):
    from torch_l2topo.cli import main

    shown = _block_after("$ python -m torch_l2topo trace-summary ")
    sample = shown[0].split()[-1]
    assert f"]({sample})" in README.read_text(), "the README links the sample trace it summarizes"
    assert main(["trace-summary", str(ROOT / sample)]) == 0
    assert shown[1:] == capsys.readouterr().out.rstrip("\n").splitlines()
    assert max(len(line) for line in shown[1:]) <= 100, "trace-summary fits 100 columns"


def test_readme_report_line_is_what_report_prints(tmp_path, capsys, monkeypatch):
    from torch_l2topo.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["report"]) == 0
    printed = capsys.readouterr().out.strip()
    assert f"prints `{printed}`" in " ".join(README.read_text().split())


# ---- docs/ pages: the same navigation line, an opening for users, the CLI list, results.md's tables ------------
DOCS = sorted((ROOT / "docs").glob("*.md"))
APPENDICES = {"ops_full_grid.md"}  # linked from the pages they extend, not from the navigation line
NAV_LINE = 3  # title, blank line, navigation


def _nav(page: Path) -> str:
    return page.read_text().splitlines()[NAV_LINE - 1]


def test_every_docs_page_has_the_same_navigation_line_naming_every_page():
    nav = _nav(ROOT / "docs" / "usage.md")
    assert all(_nav(page) == nav for page in DOCS), [p.name for p in DOCS if _nav(p) != nav]
    named = {target for target in LINK.findall(nav) if not target.startswith("../")}
    assert named == {p.name for p in DOCS} - APPENDICES


def _opening(page: Path) -> str:
    """The page before its first second-level heading."""
    return re.split(r"^## ", page.read_text(), maxsplit=1, flags=re.M)[0]


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_every_docs_page_opens_with_what_it_is_for_and_an_example(page):
    opening = _opening(page)
    assert "**What it is for.**" in "\n".join(opening.splitlines()[:8]), f"{page.name}: no opening purpose line"
    assert re.search(r"^```\w*\n.+?^```", opening, flags=re.M | re.S), f"{page.name}: no example before its sections"


def test_the_opening_check_can_fail(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# T\n\nnav\n\n**What it is for.** Things.\n\n## Section\n\n```bash\nls\n```\n")
    assert not re.search(r"^```\w*\n.+?^```", _opening(page), flags=re.M | re.S)


def _cli_lines() -> dict:
    """usage.md's command-line block: {verb: its synopsis line}."""
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text[text.index("## Command line"):]
    block = section[section.index("```bash\n") + len("```bash\n"):]
    block = block[:block.index("```")]
    lines = {}
    for line in block.splitlines():
        words = line.split()
        at = words.index("torch_l2topo")
        lines[words[at + 1]] = line
    return lines


def _parser_verbs() -> dict:
    """{verb: its option strings} from the CLI's own parser (not a list kept here)."""
    import argparse

    from torch_l2topo.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {verb: [a.option_strings for a in parser._actions if a.option_strings and a.dest != "help"]
            for verb, parser in sub.choices.items()}


def test_usage_lists_every_cli_verb_with_every_option():
    lines, verbs = _cli_lines(), _parser_verbs()
    assert set(verbs) <= set(lines), f"usage.md lacks verbs: {sorted(set(verbs) - set(lines))}"
    assert set(lines) - set(verbs) <= {"--version"}, f"usage.md names verbs cli.py lacks: {set(lines) - set(verbs)}"
    for verb, options in verbs.items():
        shown = lines[verb].split()
        missing = [o for o in options if not any(f"[{s}" in shown or f"[{s}]" in shown for s in o)]
        assert not missing, f"usage.md's `{verb}` line lacks {missing}"


def _table(text: str, heading: str) -> list:
    """The rows (lists of cells) of the first table under `## heading`."""
    lines = text[text.index(f"\n## {heading}\n"):].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return [[c.strip() for c in r.strip("|").split("|")] for r in lines[start:end] if not r.startswith("|---")]


def test_results_has_one_table_per_gpu_model_with_the_same_rows_and_linked_or_unmeasured_cells():
    text = (ROOT / "docs" / "results.md").read_text()
    h200, h100 = _table(text, "H200"), _table(text, "H100")
    assert h200[0][2] == "H200" and h100[0][2] == "H100"
    assert [r[:2] for r in h200[1:]] == [r[:2] for r in h100[1:]], "the models' tables must have the same rows"
    assert [r[3] for r in h200[1:]] == [r[3] for r in h100[1:]], "the same rows have the same targets"
    for rows in (h200, h100):
        for row in rows[1:]:
            assert row[2] == "not measured" or LINK.search(row[2]), f"a figure without its file: {row}"


def test_results_cells_are_short():
    text = (ROOT / "docs" / "results.md").read_text()
    cells = [c for line in text.splitlines() if line.startswith("|") and not line.startswith("|---")
             for c in line.strip("|").split("|")]
    long = [c.strip() for c in cells if _words(c) > 15]
    assert not long, f"results.md cells over 15 words: {long}"


def test_results_example_reads_the_latest_run_of_a_model(capsys, monkeypatch):
    text = (ROOT / "docs" / "results.md").read_text()
    code = text[text.index("```python\n") + len("```python\n"):]
    monkeypatch.chdir(ROOT)
    exec(code[:code.index("```")], {})
    printed = capsys.readouterr().out.splitlines()
    # the oracle: the table read here, line by line, for its newest H100 run's device and commit
    rows = [json.loads(line) for line in (ROOT / "benchmarks" / "results" / "profiler.jsonl").read_text().splitlines()]
    newest = max((r for r in rows if r["gpu"].startswith("NVIDIA H100")), key=lambda r: r["date"])
    assert len(printed) == sum(r["date"] == newest["date"] and r["gpu"] == newest["gpu"] for r in rows) > 0
    assert all(line.endswith(f" {newest['device_hash']} {newest['commit']}") for line in printed)


def test_fingerprints_shows_what_enroll_and_identify_print(tmp_path, capsys, monkeypatch):
    from torch_l2topo.cli import main

    text = (ROOT / "docs" / "fingerprints.md").read_text()
    block = text[text.index("```text\n$ python -m torch_l2topo enroll"):].split("\n```", 1)[0].splitlines()[1:]
    monkeypatch.chdir(tmp_path)
    for i, line in enumerate(block):
        if line.startswith("$ python -m torch_l2topo "):
            main(line.split()[4:])
            printed = capsys.readouterr().out.rstrip("\n").splitlines()
            assert block[i + 1:i + 1 + len(printed)] == printed, line
