"""The kernels without a GPU: layout constants and the device-side protocol agree between backends; every
CUDA source compiles with nvcc for sm_90 without spills; every Triton kernel compiles to PTX for an sm_90
target and emits the instructions it relies on.

On CI (CI=true) a missing nvcc or Triton is a failure, not a skip: these are CI's only look at the kernels.
"""
import re
import subprocess
from pathlib import Path

import pytest
from kernel_compile import nvcc, sm90_ptx

from torch_l2topo import layout

ROOT = Path(__file__).resolve().parents[1]
CU_SOURCES = sorted((ROOT / "cuda_ext").glob("*.cu"))


def test_cuda_layout_header_matches_python():
    header = (ROOT / "cuda_ext" / "layout.h").read_text()
    found = dict(re.findall(r"constexpr int (\w+) = ([^;]+);", header))
    names = [n for n in dir(layout) if n.isupper()]
    assert set(found) == set(names)
    for name in names:
        assert eval(found[name], {}, {k: getattr(layout, k) for k in names}) == getattr(layout, name), name


def _public_triton_functions(path: Path) -> set:
    return set(re.findall(r"@triton\.jit\ndef ([a-z]\w*)\(", path.read_text()))


def _public_cuda_functions(path: Path) -> set:
    text = re.sub(r"namespace detail \{.*?\}  // namespace detail", "", path.read_text(), flags=re.S)
    return set(re.findall(r"__device__ [^(]*?\b([a-z]\w*)\(", text))


@pytest.mark.parametrize("triton_file, cuda_file", [("protocol.py", "protocol.cuh"), ("placement.py", "placement.cuh"),
                                                    ("recorder.py", "recorder.cuh")])
def test_device_api_is_mirrored_in_both_backends(triton_file, cuda_file):
    t = _public_triton_functions(ROOT / "triton_kernels" / triton_file)
    c = _public_cuda_functions(ROOT / "cuda_ext" / cuda_file)
    assert t and t == c, (sorted(t - c), sorted(c - t))


@pytest.mark.parametrize("source", CU_SOURCES, ids=[p.name for p in CU_SOURCES])
def test_cuda_kernels_compile_for_sm90_without_spills(tmp_path, source):
    out = subprocess.run([nvcc(), "-arch=sm_90", "-O3", "-Xptxas", "-v", "-c", str(source),
                          "-o", str(tmp_path / "k.o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    kernels = re.findall(r"Compiling entry function '(\w+)'", out.stderr)
    assert kernels, out.stderr
    assert " spill stores" in out.stderr
    assert not re.search(r"[1-9]\d* bytes spill stores", out.stderr)


def test_public_headers_compile_in_a_users_kernel(tmp_path):
    """A user's kernel including the public headers (protocol, signature, placement, recorder) builds on its own."""
    src = tmp_path / "user.cu"
    src.write_text('#include "protocol.cuh"\n#include "l2_signature.cuh"\n#include "placement.cuh"\n'
                   '#include "recorder.cuh"\n'
                   "__global__ void user(int64_t* ctrl) { if (threadIdx.x == 0) l2topo::finish_turn(ctrl); }\n")
    out = subprocess.run([nvcc(), "-arch=sm_90", "-I", str(ROOT / "cuda_ext"), "-c", str(src), "-o",
                          str(tmp_path / "user.o")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr


def test_address_after_keeps_the_chain_in_cuda(tmp_path):
    """CUDA's address_after (mirror of the Triton helper the geometry and partition probes chain with): the AND
    with the runtime zero survives nvcc, between the first load and the one whose address waits for it."""
    src = tmp_path / "chain.cu"
    src.write_text('#include "protocol.cuh"\n'
                   "__global__ void chain(int64_t base, int64_t zero, int64_t* out) {\n"
                   "  int64_t v = l2topo::chase(base);\n"
                   "  out[0] = l2topo::chase(l2topo::address_after(base + 128, v, zero));\n}\n")
    out = subprocess.run([nvcc(), "-arch=sm_90", "-I", str(ROOT / "cuda_ext"), "-ptx", str(src), "-o",
                          str(tmp_path / "chain.ptx")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    ptx = (tmp_path / "chain.ptx").read_text()
    first, second = [m.start() for m in re.finditer(r"ld\.global\.cg\.u64", ptx)]
    assert "and.b64" in ptx[first:second]


PTR, I32, I64 = "*i64", "i32", "i64"


def test_triton_chain_probe_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import l2_probes as k

    sig = dict(ctrl_ptr=PTR, starts_ptr=PTR, out_ptr=PTR, n_loads=I32, n_warm_first=I32, n_first=I32, n_warm=I32,
               n_sm=I32, wave=I32, timeout_ns=I64)
    ptx = sm90_ptx(k.chain_probe_kernel, sig, {})
    assert ptx.count("ld.global.cg.u64") >= 2  # warm and timed chase
    for needle in ("%smid", "%clock64", "%globaltimer", "nanosleep.u32", "atom.global"):
        assert needle in ptx, needle


def test_triton_line_probe_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import l2_probes as k

    sig = dict(ctrl_ptr=PTR, lines_ptr=PTR, cycles_ptr=PTR, per_sm_ptr=PTR, n_lines=I32, n_warm=I32, n_timed=I32,
               n_sm=I32, wave=I32, timeout_ns=I64)
    ptx = sm90_ptx(k.line_probe_kernel, sig, {})
    assert "ld.global.cg.u64" in ptx and "%clock64" in ptx and "setp.ne.s64" in ptx


def test_triton_whereami_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import whereami

    sig = dict(lines_ptr=PTR, idx_ptr="*i32", out_ptr=PTR, N_WARM="constexpr", N_TIMED="constexpr", K="constexpr")
    ptx = sm90_ptx(whereami.whereami_kernel, sig, {"N_WARM": 2, "N_TIMED": 8, "K": 4})
    # 4 lines x (2 warm + 8 timed) unrolled dependent loads, a clock read before and after each timed run
    assert ptx.count("ld.global.cg.u64") == 40
    assert ptx.count("%clock64") == 8 and "%smid" in ptx


def test_triton_occupy_kernel_compiles_to_sm90_ptx():
    from torch_l2topo.triton_kernels import occupy

    sig = dict(chosen_ptr="*i32", held_ptr="*i32", duration_ns=I64)
    ptx = sm90_ptx(occupy.occupy_kernel, sig, {}, num_warps=occupy.WARPS_PER_CTA)
    assert "%smid" in ptx and "%globaltimer" in ptx


def test_triton_clock_kernel_compiles_to_sm90_ptx():
    """The profiler's clock link (profiler/runtime/clock.py) reads %globaltimer once and stores it."""
    from torch_l2topo.triton_kernels import clock

    ptx = sm90_ptx(clock.timer_kernel, dict(out_ptr="*i64"), {})
    assert ptx.count("%globaltimer") == 1 and "st.global.b64" in ptx


@pytest.mark.parametrize("l1, load", [(True, "ld.global.ca.u64"), (False, "ld.global.cg.u64")])
def test_triton_latency_oracle_compiles_to_sm90_ptx(l1, load):
    from torch_l2topo.triton_kernels import oracle

    sig = dict(starts_ptr=PTR, out_ptr=PTR, n_warm=I32, n_timed=I32, L1="constexpr")
    ptx = sm90_ptx(oracle.latency_oracle_kernel, sig, {"L1": l1})
    other = "ld.global.cg.u64" if l1 else "ld.global.ca.u64"
    assert ptx.count(load) == 2 and other not in ptx  # warm and timed loop, the one cache policy asked for
