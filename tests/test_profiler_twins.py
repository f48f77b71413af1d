"""Instrumented twins of Triton kernels without a GPU: the PTX rewrite (profiler/kernels/ptx.py) on kernels compiled
for sm_90 and on hand-written PTX, the twin assembled by ptxas with the original's parameter layout (cuobjdump's
KPARAM_INFO, an independent reading of the cubin), and PTX it must refuse. The records a twin writes are checked
on the GPU (tests/test_profiler_gpu.py).

On CI (CI=true) a missing Triton is a failure, not a skip (as in test_kernel_sources.py).
"""
import hashlib
import json
import re
import subprocess
from pathlib import Path

import pytest
from kernel_compile import need, sm90_ptx, triton_module

from torch_l2topo.layout import REC_CAPACITY, REC_CURSOR, REC_HEADER, REC_WORDS
from torch_l2topo.profiler.kernels import twins
from torch_l2topo.profiler.kernels.ptx import InstrumentationError, instrument, kernel_name, target

try:  # @triton.jit functions defined in the tests read `tl` from this module's globals
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

ADDRESS = 0x7F00_1234_5000
TAG = 7

if triton is not None:
    @triton.jit
    def _add(x, y, out, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(out + offs, tl.load(x + offs, mask=m) + tl.load(y + offs, mask=m), mask=m)

    @triton.jit
    def _early_exit(x, n, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        if pid * BLOCK >= n:
            return
        offs = pid * BLOCK + tl.arange(0, BLOCK)
        tl.store(x + offs, tl.load(x + offs) * 2.0)

    @triton.jit
    def _grid_3d(x, BLOCK: tl.constexpr):
        p = tl.program_id(0) + tl.num_programs(0) * (tl.program_id(1) + tl.num_programs(1) * tl.program_id(2))
        tl.store(x + p * BLOCK + tl.arange(0, BLOCK), tl.full((BLOCK,), 1.0, tl.float32))

KERNELS = {
    "add": (lambda: _add, {"x": "*fp32", "y": "*fp32", "out": "*fp32", "n": "i32", "BLOCK": "constexpr"},
            {"BLOCK": 1024}),
    "early_exit": (lambda: _early_exit, {"x": "*fp32", "n": "i32", "BLOCK": "constexpr"}, {"BLOCK": 256}),
    "grid_3d": (lambda: _grid_3d, {"x": "*fp32", "BLOCK": "constexpr"}, {"BLOCK": 128}),
}


def _ptx(name: str, num_warps: int = 4) -> str:
    triton_module()
    fn, sig, consts = KERNELS[name]
    return sm90_ptx(fn(), sig, consts, num_warps)


def _body(ptx: str) -> str:
    return ptx[ptx.index("{", ptx.index(".entry")):]


def _code(ptx: str) -> list:
    """The entry's instruction lines, comments and .loc lines dropped."""
    lines = [ln.split("//", 1)[0].strip() for ln in _body(ptx).splitlines()]
    return [ln for ln in lines if ln and not ln.startswith(".loc")]


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_twin_keeps_the_kernel_and_adds_one_exit(name):
    ptx = _ptx(name)
    twin = instrument(ptx, ADDRESS, TAG)
    # the header, the parameter list and the thread bounds are the original's, character for character
    head = ptx[:ptx.index("{", ptx.index(".entry"))]
    assert twin.startswith(head)
    # every original instruction is still there, in order, except each return, now a branch to the exit block
    original = _code(ptx)
    exit_block = twin[twin.index("$L2T_exit:"):twin.index("$L2T_done:\n\tret;\n") + len("$L2T_done:\n\tret;\n")]
    kept = [ln for ln in _code(twin.replace(exit_block, "")) if "l2t_" not in ln and "$L2T_" not in ln]
    returns = [ln for ln in original if re.fullmatch(r"(@!?%\w+\s+)?(ret|exit)(\.uni)?;", ln)]
    assert returns and [ln for ln in original if ln not in returns] == kept
    assert sum("bra $L2T_exit;" in ln for ln in _code(twin)) == len(returns)
    assert [ln for ln in _code(twin) if re.fullmatch(r"(ret|exit)(\.uni)?;", ln)] == ["ret;"]
    # the record goes to the buffer given, under the tag given, at the layout's offsets
    assert f"mov.u64 %l2t_rd2, {ADDRESS};" in twin and f"mov.u64 %l2t_rd6, {TAG};" in twin
    assert f"[%l2t_rd2+{8 * REC_CURSOR}], 1;" in twin and f"[%l2t_rd2+{8 * REC_CAPACITY}]" in twin
    assert f", {8 * REC_WORDS}, %l2t_rd2;" in twin and f", {8 * REC_HEADER};" in twin
    assert twin.count("atom.") == ptx.count("atom.") + 1 and kernel_name(twin) == kernel_name(ptx)


def test_only_thread_zero_reserves_at_the_entry_and_writes_at_the_exit():
    twin = instrument(_ptx("add"), ADDRESS, TAG)
    body = _body(twin)
    entry, exit_block = body[:body.index("$L2T_exit:")], body[body.index("$L2T_exit:"):body.index("$L2T_done:")]
    # p0 is "not thread (0, 0, 0)": set from all three thread ids before the reservation, which it predicates off
    p0 = entry.index("setp.ne.u32 %l2t_p0, %l2t_r1, 0;")
    assert all(entry.index(f"%tid.{axis}") < p0 for axis in "xyz")
    reserve = entry.index("@!%l2t_p0 atom.relaxed.gpu.global.add.u64 %l2t_rd3,")
    assert p0 < reserve and "@!%l2t_p0 ld.global.u32 %l2t_r7," in entry
    # nothing before the exit waits for the reservation: its result is read first at the exit, after the guard
    assert "%l2t_rd3" not in entry[reserve + len("@!%l2t_p0 atom.relaxed.gpu.global.add.u64 %l2t_rd3,"):]
    guard = exit_block.index("@%l2t_p0 bra $L2T_done;")
    assert guard < exit_block.index("%l2t_rd3") and exit_block.index("st.global") > guard
    assert "atom." not in exit_block


PTX_TWO_RETURNS = """
.version 8.0
.target sm_90a
.address_size 64
.func helper(.param .b32 a)
{
	ret;
}
.visible .entry k(
	.param .u64 k_param_0
)
.maxntid 128, 1, 1
{
	.reg .pred %p<2>;
	mov.u32 %r1, %tid.x;
	setp.eq.u32 %p1, %r1, 0;
	@%p1 ret;
	{ // a nested scope
	st.global.b32 [ %rd1 + 0 ], { %r1 };
	}
	ret;
}
"""


def test_predicated_and_plain_returns_of_the_entry_only():
    twin = instrument(PTX_TWO_RETURNS, ADDRESS, TAG)
    helper = twin[twin.index(".func"):twin.index(".visible")]
    assert "ret;" in helper and "L2T" not in helper  # a function's return is not the kernel's exit
    assert "@%p1 bra $L2T_exit;" in twin and twin.count("bra $L2T_exit;") == 2
    assert twin.rstrip().endswith("$L2T_done:\n\tret;\n}") and target(twin) == "sm_90a"


@pytest.mark.parametrize("ptx,match", [
    ("", "one .entry"),
    (PTX_TWO_RETURNS.replace(".visible .entry k(", ".visible .entry k(\n") + PTX_TWO_RETURNS[
        PTX_TWO_RETURNS.index(".visible"):].replace("entry k(", "entry k2("), "one .entry"),
    (PTX_TWO_RETURNS.replace("\tret;\n}\n", "\tret;\n", 1)[:-3], "balance"),
    (PTX_TWO_RETURNS.replace("@%p1 ret;", "").replace("\tret;\n}\n\"", "").replace("\tret;\n}", "\n}")
     .replace("{\n\tret;\n}", "{\n\tret;\n}"), "no ret"),
    (instrument(PTX_TWO_RETURNS, ADDRESS, TAG), "already instrumented"),
])
def test_ptx_it_cannot_rewrite_is_refused(ptx, match):
    with pytest.raises(InstrumentationError, match=match):
        instrument(ptx, ADDRESS, TAG)


@pytest.mark.parametrize("address,tag", [(0, 1), (-5, 1), (2 ** 63, 1), (ADDRESS, -1), (1.5, 1), (True, 1),
                                         (ADDRESS, "7")])
def test_bad_addresses_and_tags_are_refused(address, tag):
    with pytest.raises(ValueError):
        instrument(PTX_TWO_RETURNS, address, tag)


def _param_info(cubin: bytes, tmp_path: Path) -> list:
    """KPARAM_INFO lines of the cubin's kernel (cuobjdump -elf): ordinal, offset and size of each parameter."""
    tools = [Path(p).with_name("cuobjdump") for p in twins._ptxas_candidates()]
    tools = [t for t in tools if t.is_file()]
    need(bool(tools), "cuobjdump")
    path = tmp_path / "k.cubin"
    path.write_bytes(cubin)
    elf = subprocess.run([str(tools[0]), "-elf", str(path)], capture_output=True, text=True, check=True).stdout
    info = re.findall(r"Ordinal\s*:\s*0x\w+\s+Offset\s*:\s*0x\w+\s+Size\s*:\s*0x\w+", elf)
    assert info, "cuobjdump printed no parameter info"
    return info


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_the_twin_assembles_with_the_same_parameter_layout(name, tmp_path):
    ptx = _ptx(name)
    need(bool(twins._ptxas_candidates()), "ptxas")
    original, twin = twins.assemble(ptx), twins.assemble(instrument(ptx, ADDRESS, TAG))
    assert _param_info(twin, tmp_path) == _param_info(original, tmp_path)


def test_ptxas_errors_are_reported_as_instrumentation_errors():
    need(bool(twins._ptxas_candidates()), "ptxas")
    broken = instrument(PTX_TWO_RETURNS, ADDRESS, TAG)  # %r1 and %rd1 are never declared
    with pytest.raises(InstrumentationError, match="did not assemble"):
        twins.assemble(broken)


class _Recorder:
    """What swap_in needs of a CtaRecorder: the buffer's address, tags by kernel name, the dirty flag."""

    def __init__(self, address=ADDRESS):
        self.address, self.dirty, self.tags = address, False, {}

    def register(self, name):
        return self.tags.setdefault(name, len(self.tags))


@pytest.fixture
def launch_paths(tmp_path, monkeypatch):
    """One kernel per launch path, as a process that loaded them holds them, without a GPU: a @triton.jit kernel in
    its JIT cache, an Inductor autotuner whose Triton launcher copied the handle, and an Inductor static launcher
    whose PTX is only in Triton's cache (another, without a cached PTX, must stay plain). Handles are fake numbers;
    loading a twin returns the next fake number."""
    triton_module()
    pytest.importorskip("torch._inductor.runtime.triton_heuristics")
    from torch._inductor.runtime.static_triton_launcher import StaticallyLaunchedCudaKernel
    from torch._inductor.runtime.triton_heuristics import CachingAutotuner
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.runtime.cache import get_cache_manager

    def compiled(name):
        fn, sig, consts = KERNELS[name]
        return triton.compile(ASTSource(fn(), sig, consts), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4})

    need(bool(twins._ptxas_candidates()), "ptxas")
    jit_kernel, launcher_kernel, static_source = compiled("add"), compiled("early_exit"), compiled("grid_3d")
    jit_kernel.function, launcher_kernel.function = 101, 102
    jit_fn = KERNELS["add"][0]()
    monkeypatch.setitem(jit_fn.device_caches, 0, ({"key": jit_kernel}, {}, None, None, None))
    scope = {"bin": launcher_kernel, "function": 102}
    exec("def launcher():\n    return function", scope)
    autotuner = CachingAutotuner.__new__(CachingAutotuner)
    autotuner.launchers, autotuner.device_props = [scope["launcher"]], type("P", (), {"index": 0})()
    statics = []
    for name, handle in (("with_ptx", 103), ("without_ptx", 104)):
        static = StaticallyLaunchedCudaKernel.__new__(StaticallyLaunchedCudaKernel)
        static.name, static.hash, static.shared, static.num_warps, static.function = \
            name, hashlib.sha256(name.encode()).hexdigest(), 0, 4, handle
        statics.append(static)
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    where = Path(get_cache_manager(statics[0].hash).cache_dir)  # Triton's own name for the kernel's directory
    where.mkdir(parents=True, exist_ok=True)
    (where / "with_ptx.ptx").write_text(static_source.asm["ptx"].replace("_grid_3d", "with_ptx"))
    static_scopes = [{"runner": s.run} for s in statics]
    for s_scope in static_scopes:
        exec("def launcher():\n    return runner", s_scope)
    autotuner.launchers += [s_scope["launcher"] for s_scope in static_scopes]
    loads = iter(range(900, 1000))
    monkeypatch.setattr(twins, "_load", lambda name, cubin, shared, device: (None, next(loads), 1024))
    yield {"jit": jit_kernel, "scope": scope, "launcher": launcher_kernel, "statics": statics, "keep": autotuner}


def test_every_launch_path_runs_its_twin_in_the_cycle_and_its_original_after(launch_paths):
    found = {k.name: k for k in twins.loaded_kernels()}
    assert {"_add", "_early_exit", "with_ptx", "without_ptx"} <= set(found)
    rec = _Recorder()
    pair = twins.Twins()
    covered = pair.swap_in({0: rec})
    jit, scope, launcher = launch_paths["jit"], launch_paths["scope"], launch_paths["launcher"]
    with_ptx, without_ptx = launch_paths["statics"]
    assert {"_add", "_early_exit", "with_ptx"} <= set(covered["instrumented"])
    assert "PTX was not found" in covered["plain"]["without_ptx"]
    twins_in = (jit.function, scope["function"], launcher.function, with_ptx.function)
    assert all(h >= 900 for h in twins_in) and scope["function"] == launcher.function
    assert without_ptx.function == 104 and rec.dirty and set(rec.tags) >= {"_add", "_early_exit", "with_ptx"}
    pair.swap_out()
    assert (jit.function, scope["function"], launcher.function, with_ptx.function, without_ptx.function) == \
        (101, 102, 102, 103, 104)
    again = pair.swap_in({0: rec})  # a later cycle: the same twins, nothing rebuilt
    assert (jit.function, scope["function"], launcher.function, with_ptx.function) == twins_in and again == covered
    pair.swap_out()


def test_kernels_of_other_gpus_are_left_alone(launch_paths):
    pair = twins.Twins()
    assert pair.swap_in({1: _Recorder()}) == {"instrumented": [], "plain": {}}
    assert launch_paths["jit"].function == 101


@pytest.mark.parametrize("fusion,extra,expected", [(True, None, ()), (False, None, ("--fmad=false",)),
                                                   (True, "-O2 --extensible-whole-program", ("-O2",
                                                                                         "--extensible-whole-program"))])
def test_the_twin_is_assembled_as_triton_assembled_its_original(fusion, extra, expected):
    meta = type("Meta", (), {"enable_fp_fusion": fusion, "ptx_options": extra})()
    assert twins._ptxas_options(meta) == expected


def test_a_cycle_scans_the_process_once(launch_paths, monkeypatch):
    scans = []
    real = twins.loaded_kernels
    monkeypatch.setattr(twins, "loaded_kernels", lambda: scans.append(1) or real())
    pair, rec = twins.Twins(), _Recorder()
    pair.build({0: rec})  # the warmup step
    assert launch_paths["jit"].function == 101  # built, not swapped in
    covered = pair.swap_in({0: rec})  # the active step: build's scan, not another
    assert len(scans) == 1 and "_add" in covered["instrumented"] and launch_paths["jit"].function >= 900
    pair.swap_out()
    pair.swap_in({0: rec})  # a cycle without a build first scans for itself
    assert len(scans) == 2
    pair.swap_out()


def test_a_kernel_built_without_fp_fusion_gets_a_twin_assembled_without_it(monkeypatch):
    meta = type("Meta", (), {"shared": 0, "num_warps": 4, "enable_fp_fusion": False, "ptx_options": None})()
    kernel = type("Kernel", (), {"name": "k", "hash": "h", "metadata": meta, "asm": {"ptx": PTX_TWO_RETURNS},
                                 "function": 5})()
    assembled = []
    monkeypatch.setattr(twins, "assemble", lambda ptx, options=(): assembled.append((ptx, options)) or b"cubin")
    monkeypatch.setattr(twins, "_load", lambda name, cubin, shared, device: (None, 77, 1024))
    loaded = twins._compiled(kernel, 0, [(kernel, "function")])
    assert twins.Twins()._build(loaded, ADDRESS, TAG) == 77
    (ptx, options), = assembled
    assert options == ("--fmad=false",) and "$L2T_exit" in ptx


def test_a_static_kernels_ptx_and_options_are_read_beside_its_cubin(tmp_path):
    cubin = tmp_path / "elsewhere" / "k.cubin"
    cubin.parent.mkdir()
    cubin.write_bytes(b"cubin")
    cubin.with_suffix(".ptx").write_text(PTX_TWO_RETURNS)
    cubin.with_suffix(".json").write_text(json.dumps({"enable_fp_fusion": False, "ptx_options": None}))
    kernel = type("Static", (), {"name": "k", "hash": "00ff", "shared": 0, "num_warps": 4, "function": 5,
                                 "cubin_path": str(cubin)})()
    loaded = twins._static(kernel, 0)
    assert loaded.ptx_source() == PTX_TWO_RETURNS and loaded.ptxas_options == ("--fmad=false",)
    cubin.with_suffix(".ptx").unlink()
    assert twins._static(kernel, 0).ptx_source is None
