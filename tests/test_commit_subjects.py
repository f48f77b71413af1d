"""Commit subjects stay scannable: `area: what changed`, at most 72 characters, for every commit after the last one
written before the rule (numbers and reasons go in the body). Outside a git checkout with that history (a source
archive, a shallow clone) there is nothing to read and the test says so."""
import subprocess
from pathlib import Path

import pytest

RULE_SINCE = "54ec8ac"  # the last commit before the rule: its history keeps its long subjects
MAX_SUBJECT = 72
ROOT = Path(__file__).resolve().parents[1]


def _git(*args) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30)


def long_subjects(subjects) -> list:
    return [s for s in subjects if len(s) > MAX_SUBJECT]


def test_the_rule_catches_a_long_subject():
    assert long_subjects(["profiler: short", "x" * 73]) == ["x" * 73] and not long_subjects(["y" * 72])


def test_every_commit_since_the_rule_has_a_short_subject():
    try:
        known = _git("cat-file", "-e", f"{RULE_SINCE}^{{commit}}").returncode == 0
    except OSError:
        known = False
    if not known:
        pytest.skip(f"no git history holding {RULE_SINCE} here")
    log = _git("log", "--format=%s", f"{RULE_SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    assert long_subjects(log.stdout.splitlines()) == []
