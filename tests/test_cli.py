"""The command line on bundled data (no GPU needed), its errors and its exit statuses."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import torch_l2topo
from torch_l2topo.cli import main

ROOT = Path(__file__).resolve().parents[1]
RECORDED_GEOMETRY = ROOT / "tests" / "data" / "geometry" / "geometry_h200_a632ac7b8bef.json"


def _one_line_error(capsys, *fragments) -> str:
    err = capsys.readouterr().err
    assert err.startswith("torch_l2topo: error:") and err.count("\n") == 1, err
    assert "Traceback" not in err and all(f in err for f in fragments), err
    return err


def test_main_job_without_a_gpu_shows_bundled_data_and_says_so():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # a GPU box must take the no-GPU path here too
    out = subprocess.run([sys.executable, "-m", "torch_l2topo"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "No CUDA GPU on this machine: showing bundled data, a real calibration of an NVIDIA H200" in out.stdout
    assert "measured 2026-" in out.stdout and "cycles per load" in out.stdout
    # the one-line hint of the next step closes the output
    assert out.stdout.rstrip().splitlines()[-1].startswith("next: `python -m torch_l2topo report` writes")


def test_show_bundled_example(capsys):
    assert main(["show", "--example", "h200"]) == 0
    text = capsys.readouterr().out
    assert "NVIDIA H200" in text and "132 SMs" in text


def test_show_json_is_machine_readable(capsys):
    assert main(["show", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["chain_cycles"]) == doc["meta"]["device"]["sm_count"] > 0  # whichever GPU or bundled map


def test_show_a_saved_file(tmp_path, capsys):
    path = torch_l2topo.load_example(torch_l2topo.list_examples()[-1]).save(tmp_path / "t.npz")
    assert main(["show", str(path)]) == 0
    assert "NVIDIA H200" in capsys.readouterr().out


def test_examples_lists_every_bundled_calibration_with_a_description(capsys, monkeypatch):
    monkeypatch.setattr("torch_l2topo.bundled.visible_gpu_name", lambda: None)  # a GPU box: the no-GPU default here
    assert main(["examples"]) == 0
    listing, note = capsys.readouterr().out.split("\n\n")
    lines = listing.splitlines()
    assert note.startswith("[default]:") and "no CUDA GPU here: the h200 fallback" in note
    assert [line.split()[0] for line in lines] == torch_l2topo.list_examples()
    models = {"h200": "NVIDIA H200 (", "h100": "NVIDIA H100 80GB HBM3 ("}
    for line in lines:  # what the name says (<model>-<uuid hash>-<backend>-<mode>), the description must say too
        model, uuid, backend, mode = line.split()[0].split("-")
        assert f"{models[model]}uuid-hash {uuid}" in line and f"{backend} backend, {mode} mode" in line
        assert re.search(r"measured 20\d\d-\d\d-\d\d", line)
    assert sum(line.endswith("[default]") for line in lines) == 1
    assert {line.split("-")[0] for line in lines} == set(models)  # both Hopper models have a bundled map


def test_version_is_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    declared = re.search(r'^version = "(.+)"', (ROOT / "pyproject.toml").read_text(), re.M).group(1)
    assert capsys.readouterr().out.strip() == f"torch_l2topo {declared}"


def test_help_documents_exit_statuses_and_options(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "0 done (identify: match), 1 identify: no match, 3 identify: ambiguous, 4 fleet: health Fail, 2 error" \
        in out
    for verb, needle in (("calibrate", "--backend {auto,triton,cuda} probe kernels"),
                         ("show", "--json print JSON"), ("identify", "exit status: 0 match, 1 no match, 3 ambiguous")):
        with pytest.raises(SystemExit):
            main([verb, "--help"])
        assert needle in " ".join(capsys.readouterr().out.split()), verb


@pytest.mark.parametrize("argv,message", [(["show", "--example", "nope"], "no bundled calibration named 'nope'"),
                                          (["show", "/no/such/file.npz"], "No such file"),
                                          (["report", "nope", "-o", "/tmp/x"], "no bundled calibration named 'nope'")])
def test_errors_are_one_line_and_exit_2(argv, message, capsys):
    assert main(argv) == 2
    _one_line_error(capsys, message)


def test_output_paths_that_are_files_are_one_line_errors(tmp_path, capsys):
    taken = tmp_path / "taken"
    taken.write_text("x")
    assert main(["report", "-o", str(taken)]) == 2
    _one_line_error(capsys, f"{taken} exists and is not a directory")
    assert main(["geometry", "--from", str(RECORDED_GEOMETRY), "--figures", str(taken)]) == 2
    _one_line_error(capsys, f"{taken} exists and is not a directory")
    assert main(["report", "-o", str(taken / "below")]) == 2  # a file where a parent directory should be
    _one_line_error(capsys, str(taken / "below"), "Not a directory")
    assert taken.read_text() == "x"


def test_a_closed_output_pipe_ends_quietly(tmp_path):
    """`geometry --from X --figures DIR | head -5`: the reader goes away; no traceback, exit 141 (SIGPIPE's)."""
    proc = subprocess.Popen([sys.executable, "-m", "torch_l2topo", "geometry", "--from", str(RECORDED_GEOMETRY),
                             "--figures", str(tmp_path / "figs")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    proc.stdout.close()  # the reader is gone before the first line is written: every write fails
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err.decode()) == (141, "")


@pytest.mark.parametrize("content", ["pickled", "garbage"])
def test_show_on_a_foreign_npz_says_it_is_not_a_calibration(tmp_path, capsys, content):
    import numpy as np

    path = tmp_path / "foreign.npz"
    if content == "pickled":
        np.savez(path, a=np.array([object()], dtype=object))
    else:
        path.write_bytes(b"\x80\x04 garbage")
    assert main(["show", str(path)]) == 2
    err = _one_line_error(capsys, f"{path} is not a readable calibration")
    assert "pickle" not in err


def test_a_resaved_bundled_calibration_names_its_own_file(tmp_path, capsys):
    path = torch_l2topo.load_example("h200").save(tmp_path / "mine.npz")
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith(f"source: {path}") and "bundled example" not in out


def test_report_compare_says_when_the_other_calibration_is_another_gpu(tmp_path, capsys):
    assert main(["report", "--compare", "h200-d00e55-cuda-waves", "-o", str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("note: h200-d00e55-cuda-waves is a calibration of another GPU (uuid-hash d00e55adfd8e, "
                          "this one 1e5731f1cbe2)")
    assert "(another GPU)" in (tmp_path / "a" / "report.md").read_text()
    assert main(["report", "--compare", "h200-1e5731-triton-waves", "-o", str(tmp_path / "b")]) == 0  # same GPU
    assert "another GPU" not in capsys.readouterr().out + (tmp_path / "b" / "report.md").read_text()


# ---- enroll and identify: checked before anything is measured; distinct exit statuses --------------------
@pytest.fixture
def no_calibration(monkeypatch):
    """calibrate() fails the test if called: the checks below must come before any measuring."""
    from torch_l2topo.measure import calibration

    def refuse(*args, **kwargs):
        raise AssertionError("calibrate() ran before the command's own checks")

    monkeypatch.setattr(calibration, "calibrate", refuse)


def test_enroll_checks_the_name_before_identify_or_calibrate(tmp_path, capsys, no_calibration):
    reg = str(tmp_path / "reg")
    assert main(["enroll", "gpu-a", "h200", "--registry", reg]) == 0
    capsys.readouterr()
    assert main(["enroll", "bad name!", "h200", "--registry", reg]) == 2  # identify would print "before ..."
    assert capsys.readouterr().out == ""
    assert main(["enroll", "bad name!", "--registry", reg]) == 2  # no file: it would calibrate this GPU
    _one_line_error(capsys, "registry names are", "'bad name!'")


def test_enroll_of_a_taken_name_points_to_the_flag(tmp_path, capsys, no_calibration):
    reg = str(tmp_path / "reg")
    assert main(["enroll", "gpu-a", "h200-d557bc-cuda-waves", "--registry", reg]) == 0
    capsys.readouterr()
    assert main(["enroll", "gpu-a", "--registry", reg]) == 2
    err = _one_line_error(capsys, "registry entry 'gpu-a' exists", "pass --replace to overwrite it")
    assert "replace=True" not in err
    assert main(["enroll", "gpu-a", "h200-f78934-cuda-waves", "--registry", reg, "--replace"]) == 0
    assert main(["identify", "h200-f78934-triton-waves", "--registry", reg]) == 0  # the replaced entry matches


def test_identify_with_a_missing_registry_is_an_error(tmp_path, capsys, no_calibration):
    missing = tmp_path / "no" / "such"
    assert main(["identify", "--registry", str(missing)]) == 2
    _one_line_error(capsys, f"no registry at {missing}")
    assert main(["identify", "h200", "--registry", str(missing), "--json"]) == 2
    _one_line_error(capsys, f"no registry at {missing}")


def test_identify_exit_status_tells_match_from_no_match(tmp_path, capsys):
    """0 match, 1 no match (3 ambiguous: tests/test_registry.py, the same board under two names)."""
    reg = str(tmp_path / "reg")
    assert main(["enroll", "gpu-a", "h200-d557bc-cuda-waves", "--registry", reg]) == 0
    assert main(["identify", "h200-d557bc-triton-waves", "--registry", reg]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("match: 'gpu-a'")
    assert main(["identify", "h200-f78934-cuda-waves", "--registry", reg, "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert (doc["verdict"], doc["name"], doc["nearest"]) == ("no match", None, "gpu-a")


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


@pytest.mark.parametrize("argv,message", [(["build", "--cc", "9"], "MAJOR.MINOR"),
                                          (["build", "--cc", "7.5"], "8.0 or newer"),
                                          (["build", "--cc", "x.y"], "MAJOR.MINOR")])
def test_build_refuses_bad_architectures(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_build_builds_each_architecture_once(monkeypatch, capsys):
    from torch_l2topo.measure import extension

    built = []
    monkeypatch.setattr(extension, "build_ahead", lambda cc, progress: built.append(cc) or progress(f"sm{cc}"))
    assert main(["build", "--cc", "9.0", "--cc", "8.0", "--cc", "9.0"]) == 0
    assert built == [(9, 0), (8, 0)] and "built for sm_90, sm_80" in capsys.readouterr().out
