"""The command line on bundled data (no GPU needed), and its errors."""
import json
import os
import subprocess
import sys

import pytest

import torch_l2topo
from torch_l2topo.cli import main


def test_main_job_without_a_gpu_shows_bundled_data_and_says_so():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a GPU box must take the no-GPU path here too
    out = subprocess.run([sys.executable, "-m", "torch_l2topo"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "No CUDA GPU on this machine: showing bundled data, a real calibration of an NVIDIA H200" in out.stdout
    assert "measured 2026-" in out.stdout and "cycles per load" in out.stdout


def test_show_bundled_example(capsys):
    assert main(["show", "--example", "h200"]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA H200" in text and "132 SMs" in text


def test_show_json_is_machine_readable(capsys):
    assert main(["show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["chain_cycles"]) == 132 and doc["meta"]["device"]["name"] == "NVIDIA H200"


def test_show_a_saved_file(tmp_path, capsys):
    path = torch_l2topo.load_example(torch_l2topo.list_examples()[-1]).save(tmp_path / "t.npz")
    assert main(["show", str(path)]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out


def test_examples_lists_every_bundled_calibration(capsys):
    assert main(["examples"]) == 0
    assert capsys.readouterr().out.split() == torch_l2topo.list_examples()


@pytest.mark.parametrize("argv,message", [(["show", "--example", "nope"], "no bundled calibration named 'nope'"),
                                          (["show", "/no/such/file.npz"], "No such file"),
                                          (["report", "nope", "-o", "/tmp/x"], "no bundled calibration named 'nope'")])
def test_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.startswith("torch_l2topo: error:") and err.count("\n") == 1


def test_a_failed_extension_build_is_one_line_not_a_traceback(capsys, monkeypatch):
    from torch_l2topo.errors import BackendUnavailable
    from torch_l2topo.measure import calibration

    def fail(*args, **kwargs):
        raise BackendUnavailable("building the CUDA extension x failed (nvcc fatal); compiler output in /tmp/log")

    monkeypatch.setattr(calibration, "calibrate", fail)
    assert main(["calibrate", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err == ("torch_l2topo: error: building the CUDA extension x failed (nvcc fatal); "
                   "compiler output in /tmp/log\n")


def test_a_directory_given_as_calibration_is_a_clear_error(tmp_path, capsys):
    assert main(["show", str(tmp_path)]) == 2
    assert "cannot be read" in capsys.readouterr().err


def test_calibrate_without_a_gpu_is_a_clear_error(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["calibrate"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_bad_arguments_exit_with_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--backend", "opencl"])
    assert exc.value.code == 2
