"""Every example runs (CPU path on machines without a GPU), leaves nothing outside its working directory, and ends
quietly when its output pipe closes early (`python examples/x.py | head`)."""
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_main_runs(path, capsys, cache_dir, tmp_path, monkeypatch):
    work, temp = tmp_path / "work", tmp_path / "tmp"
    work.mkdir()
    temp.mkdir()
    monkeypatch.chdir(work)  # what an example writes by default lands here
    monkeypatch.setattr(tempfile, "tempdir", str(temp))  # and what it puts in the temporary directory, here
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    assert capsys.readouterr().out.strip()
    # nothing of ours left in the temporary directory (torch's own caches, torchinductor_<user>, may be there)
    assert not list(temp.glob("*l2topo*")), list(temp.iterdir())


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_piped_into_head_ends_quietly(path, tmp_path):
    """Its reader gone before the first line: exit 141 (SIGPIPE's), nothing on stderr, no traceback."""
    proc = subprocess.Popen([sys.executable, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), TORCH_L2TOPO_CACHE=str(tmp_path / "cache"),
                                     CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "")))
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert (proc.returncode, err.decode()) == (141, ""), err.decode()[-2000:]
