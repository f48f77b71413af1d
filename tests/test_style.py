"""One style: ruff (pyflakes, pycodestyle, import sorting; 120 columns; pyproject.toml [tool.ruff]) passes on
the whole repository. CI installs ruff with the [test] extra, so there a missing ruff fails instead of skipping."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_ruff_passes(in_ci):
    have = shutil.which("ruff") or subprocess.run([sys.executable, "-m", "ruff", "--version"],
                                                  capture_output=True).returncode == 0
    if not have:
        if in_ci:
            pytest.fail("ruff is not installed: pip install -e '.[test]'")
        pytest.skip("ruff is not installed")
    out = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
