"""The kernels without a GPU: layout constants agree between backends; CUDA compiles with nvcc for sm_90;
every Triton kernel compiles to PTX for an sm_90 target and emits the instructions the probes rely on.

On CI (CI=true) a missing nvcc or Triton is a failure, not a skip: these are CI's only look at the kernels.
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from torch_l2topo import probe_layout

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _need(available: bool, what: str):
    if not available:
        if IN_CI:
            pytest.fail(f"{what} is missing on CI")
        pytest.skip(f"{what} not available here")


def test_cuda_layout_header_matches_python():
    header = (ROOT / "cuda_ext" / "probe_layout.h").read_text()
    found = dict(re.findall(r"constexpr int (\w+) = ([^;]+);", header))
    names = [n for n in dir(probe_layout) if n.isupper()]
    assert set(found) == set(names)
    for name in names:
        assert eval(found[name], {}, {k: getattr(probe_layout, k) for k in names}) == getattr(probe_layout, name), name


def test_cuda_kernels_compile_for_sm90(tmp_path):
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").exists() else None)
    _need(nvcc is not None, "nvcc")
    out = subprocess.run([nvcc, "-arch=sm_90", "-O3", "-Xptxas", "-v", "-c", str(ROOT / "cuda_ext" / "l2_probes.cu"),
                          "-o", str(tmp_path / "l2_probes.o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = out.stderr
    assert "chain_probe_kernel" in report and "line_probe_kernel" in report
    assert " spill stores" in report
    assert not re.search(r"[1-9]\d* bytes spill stores", report)


def _triton_compile(fn, signature, constexprs):
    try:
        import triton
    except ImportError:
        _need(False, "triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    return triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 1})


PTR, I32, I64 = "*i64", "i32", "i64"


def test_triton_chain_probe_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import l2_probes as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, out_ptr=PTR, n_loads=I32, capacity=I32, n_sm=I32, wave=I32,
               timeout_ns=I64)
    ptx = _triton_compile(k.chain_probe_kernel, sig, {}).asm["ptx"]
    assert ptx.count("ld.global.cg.u64") >= 2  # warm and timed chase
    for needle in ("%smid", "%clock64", "%globaltimer", "nanosleep.u32", "atom.global"):
        assert needle in ptx, needle


def test_triton_line_probe_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import l2_probes as k

    sig = dict(ctrl_ptr=PTR, lines_ptr=PTR, cycles_ptr=PTR, per_sm_ptr=PTR, n_lines=I32, n_warm=I32, n_timed=I32,
               capacity=I32, n_sm=I32, wave=I32, timeout_ns=I64, LINE_WORDS="constexpr")
    ptx = _triton_compile(k.line_probe_kernel, sig, {"LINE_WORDS": probe_layout.LINE_WORDS}).asm["ptx"]
    assert "ld.global.cg.u64" in ptx and "%clock64" in ptx and "setp.ne.s64" in ptx


def test_triton_occupy_kernel_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import occupy

    sig = dict(chosen_ptr="*i32", held_ptr="*i32", duration_ns=I64)
    ptx = _triton_compile(occupy.occupy_kernel, sig, {}).asm["ptx"]
    assert "%smid" in ptx and "%globaltimer" in ptx
