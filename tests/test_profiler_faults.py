"""The profiler's safety promise under injected faults (docs/profiler.md, Safety), each in a job of its own
(profiler_job.py): the job finishes (or ends by the signal it got, as it would have without us), every cycle's
trace that torch wrote is on disk (enriched, or byte for byte as torch wrote it), one warning per trace that was
not enriched, naming it, nothing of ours left behind (temporary files, record slots, worker processes), and no
wait beyond its bound."""
import errno
import glob
import gzip
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torch_l2topo.files import host_tag, pid_alive
from torch_l2topo.profiler.trace.tracefile import METADATA_KEY, load_trace, strip

JOB = Path(__file__).resolve().parent / "profiler_job.py"
JOB_TIMEOUT_S = 90  # a hung job fails the test long before any default wait of ours would matter
TIMEOUT_S = 2.0     # the enrichment wait the jobs that must give up are given


def run_job(out: Path, *args, expect_rc: int = 0) -> dict:
    proc = subprocess.run([sys.executable, str(JOB), str(out), *args], capture_output=True, text=True,
                          timeout=JOB_TIMEOUT_S)
    assert proc.returncode == expect_rc, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    assert "Traceback" not in proc.stderr or expect_rc not in (0, -signal.SIGTERM), proc.stderr[-3000:]
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    report = json.loads(lines[-1])
    report["stderr"] = proc.stderr
    return report


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def assert_nothing_left(out: Path, report: dict) -> None:
    """No temporary file beside the traces, no record slot of this host's dead processes, no worker alive."""
    assert not [p.name for p in out.parent.rglob("*.l2topo-tmp")]
    assert not glob.glob(f"/dev/shm/l2topo-records-{host_tag()}-*")
    deadline = time.monotonic() + 10
    while any(pid_alive(pid) for pid in report["worker_pids"]):  # reaped by its parent, or gone with it
        assert time.monotonic() < deadline, f"worker processes {report['worker_pids']} outlived the job"
        time.sleep(0.05)


def assert_enriched(path, plain_copy) -> None:
    """`path` is the enriched version of the trace torch wrote (plain_copy): the same events plus ours."""
    enriched = load_trace(path)
    assert METADATA_KEY in enriched and strip(enriched) == strip(load_trace(plain_copy))


def plain_copy(out: Path, path) -> Path:
    return Path(str(out) + ".plain") / Path(path).name


def not_enriched_warnings(report: dict, path) -> list:
    return [w for w in report["warnings"] if str(path) in w]


def assert_left_plain(report: dict, path, digest, cause: str) -> None:
    """`path` is byte for byte what torch wrote (digest), and one warning names it with `cause`."""
    assert sha(path) == digest
    (warning,) = not_enriched_warnings(report, path)
    assert cause in warning


@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
def test_an_unfaulted_job_enriches_every_trace_in_place(tmp_path, foreground):
    out = tmp_path / "traces"
    report = run_job(out, "--cycles", "3", *(["--foreground"] if foreground else []))
    assert len(report["traces"]) == 3 and not report["warnings"]
    for path in report["traces"]:
        assert_enriched(path, plain_copy(out, path))
        assert os.stat(path).st_mode & 0o777 == 0o666 & ~0o022  # as torch's export: umask 022 here
    assert_nothing_left(out, report)


@pytest.mark.parametrize("foreground", [False, True], ids=["background", "foreground"])
def test_a_full_trace_disk_costs_the_enrichment_only(tmp_path, foreground):
    """ENOSPC on the enriched trace's write (its temporary file already made): the plain traces stay byte for
    byte, one warning each, no temporary file; the job goes on (no livelock, no segfault at the block's end)."""
    out = tmp_path / "traces"
    report = run_job(out, "--fault", "enospc", "--cycles", "3", "--timeout", "20",
                     *(["--foreground"] if foreground else []))
    assert len(report["traces"]) == 3
    for path, digest in report["traces"].items():
        assert_left_plain(report, path, digest, "No space left")
        assert load_trace(path)["traceEvents"]
    assert report["block_end_s"] < 20
    assert_nothing_left(out, report)


def test_warnings_turned_into_errors_still_never_raise_into_the_loop(tmp_path):
    """Under -W error (a test suite's filterwarnings) our warnings would be exceptions in prof.step(): they go to
    stderr instead, and the job goes on."""
    out = tmp_path / "traces"
    report = run_job(out, "--fault", "enospc", "--cycles", "2", "--foreground", "--warnings-as-errors")
    assert len(report["traces"]) == 2 and report["stderr"].count("torch_l2topo warning:") == 2
    for path, digest in report["traces"].items():
        assert sha(path) == digest


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True).returncode == 0


def test_a_real_full_disk(tmp_path):
    """A 64 KiB tmpfs as the trace directory: the plain traces (8 KB) fit, their enriched versions (75 KB) do
    not. Where mounting is not allowed, test_a_full_trace_disk_costs_the_enrichment_only injects ENOSPC."""
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "64k"):
        pytest.skip("no tmpfs can be mounted here (not root)")
    try:
        out = disk / "traces"
        report = run_job(out, "--cycles", "3", "--timeout", "20")
        assert len(report["traces"]) == 3 and report["block_end_s"] < 20
        for path, digest in report["traces"].items():
            if digest is not None and sha(path) == digest:  # left as torch wrote it: warned once
                assert len(not_enriched_warnings(report, path)) == 1
            else:
                assert_enriched(path, plain_copy(out, path))
        assert any("No space left" in w for w in report["warnings"])
        assert not list(disk.rglob("*.l2topo-tmp"))
        assert_nothing_left(out, report)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


@pytest.mark.parametrize("fault", ["export-missing", "export-empty", "export-raises"])
def test_a_trace_torch_could_not_write_is_warned_and_the_job_goes_on(tmp_path, fault):
    out = tmp_path / "traces"
    report = run_job(out, "--fault", fault, "--cycles", "2")
    assert len(report["traces"]) == 2
    for path in report["traces"]:
        (warning,) = not_enriched_warnings(report, path)
        assert "not written whole" in warning
    assert_nothing_left(out, report)


@pytest.mark.parametrize("fault,gz", [("export-garbage", False), ("export-truncated-gzip", True)])
def test_bad_bytes_leave_the_trace_as_torch_wrote_it(tmp_path, fault, gz):
    out = tmp_path / "traces"
    report = run_job(out, "--fault", fault, "--cycles", "2", *(["--gzip"] if gz else []))
    for path, digest in report["traces"].items():
        assert_left_plain(report, path, digest, "could not enrich")
    assert_nothing_left(out, report)


def test_a_foreign_trace_with_a_nested_events_key_is_enriched_at_its_top_level(tmp_path):
    out = tmp_path / "traces"
    report = run_job(out, "--fault", "export-foreign", "--cycles", "1")
    (path,) = report["traces"]
    trace = load_trace(path)
    assert not report["warnings"] and METADATA_KEY in trace
    assert trace["a"] == {"traceEvents": [{"ph": "i", "name": "nested"}]}  # the nested one untouched
    assert strip(trace)["traceEvents"] == load_trace(plain_copy(out, path))["traceEvents"]


def test_a_worker_that_dies_leaves_its_traces_plain(tmp_path):
    out = tmp_path / "traces"
    report = run_job(out, "--fault", "crash", "--cycles", "3", "--timeout", "30")
    for path, digest in report["traces"].items():
        if sha(path) == digest:
            assert_left_plain(report, path, digest, "exited")
        else:  # done by the job's own process at the block's end
            assert_enriched(path, plain_copy(out, path))
    assert report["block_end_s"] < 30
    assert_nothing_left(out, report)


def test_a_slow_worker_is_given_up_at_the_timeout(tmp_path):
    out = tmp_path / "traces"
    report = run_job(out, "--fault", "slow", "--cycles", "3", "--timeout", str(TIMEOUT_S))
    assert TIMEOUT_S <= report["block_end_s"] < TIMEOUT_S + 3
    for path, digest in report["traces"].items():
        assert_left_plain(report, path, digest, "gave up")
    assert_nothing_left(out, report)


def test_a_user_error_mid_block_keeps_every_trace_and_is_the_one_raised(tmp_path):
    out = tmp_path / "traces"
    proc = subprocess.run([sys.executable, str(JOB), str(out), "--cycles", "4", "--raise-after", "3"],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == 1 and "RuntimeError: user error" in proc.stderr  # no crash, no exception of ours
    traces = sorted(out.glob("*.json"))
    assert len(traces) == 4  # three cycles ended by prof.step(), the fourth by the block's end, as in torch's
    for path in traces:
        assert_enriched(path, plain_copy(out, path))
    assert not list(tmp_path.rglob("*.l2topo-tmp")) and not glob.glob(f"/dev/shm/l2topo-records-{host_tag()}-*")


@pytest.mark.parametrize("sig", ["TERM", "INT"])
def test_a_signal_mid_block_ends_the_job_as_it_would_with_every_trace_on_disk(tmp_path, sig):
    """A worker busy with a (slow) job, more jobs waiting, a record slot in /dev/shm; then SIGTERM (default action:
    the process ends without atexit) or SIGINT (KeyboardInterrupt): the job ends by that signal as it would have
    without us, every cycle's trace is on disk and whole, the worker is gone and no slot or temporary file stays."""
    out = tmp_path / "traces"
    proc = subprocess.run([sys.executable, str(JOB), str(out), "--cycles", "6", "--signal", sig, "--signal-after",
                           "4", "--fault", "slow", "--max-held", "0", "--timeout", str(TIMEOUT_S), "--slot"],
                          capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert proc.returncode == (-signal.SIGTERM if sig == "TERM" else -signal.SIGINT), proc.stderr[-2000:]
    report = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][0])
    assert len(report["traces"]) == 4 and report["worker_pids"]
    for path, digest in report["traces"].items():
        assert sha(path) == digest and load_trace(path)["traceEvents"]  # whole, as torch wrote it
    assert_nothing_left(out, report)


def test_records_of_a_killed_process_are_removed_by_the_next_block(tmp_path):
    """What a process killed outright left (a record slot in /dev/shm, a temporary trace file) goes when the next
    profile() block starts; files of live processes and of other hosts stay."""
    import torch

    import torch_l2topo
    from torch_l2topo.profiler.runtime.spool import SLOT_PREFIX, spool_directory

    traces = tmp_path / "traces"
    traces.mkdir()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    dead = child.pid
    child.kill()
    child.wait()
    shm = spool_directory()
    left = [shm / f"{SLOT_PREFIX}{host_tag()}-{dead}-0-abc12345.bin",
            traces / f".t.json.{host_tag()}-{dead}-x1y2z3.l2topo-tmp"]
    kept = [shm / f"{SLOT_PREFIX}{host_tag()}-{os.getpid()}-0-abc12345.bin",  # ours: alive
            shm / f"{SLOT_PREFIX}0badc0de-{dead}-0-abc12345.bin",  # another host's (or pid namespace's)
            traces / ".t.json.tmp"]  # not ours
    for p in left + kept:
        p.write_bytes(b"x")
    try:
        with torch_l2topo.profile(traces, activities=[torch.profiler.ProfilerActivity.CPU], topology=None):
            pass
        assert not any(p.exists() for p in left) and all(p.exists() for p in kept)
    finally:
        for p in left + kept:
            p.unlink(missing_ok=True)


def test_a_modest_umask_gives_private_traces(tmp_path):
    from torch_l2topo.files import atomic_write

    old = os.umask(0o077)
    try:
        path = atomic_write(tmp_path / "t.json", b"{}")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.stat(atomic_write(tmp_path / "u.json", b"{}")).st_mode & 0o777 == 0o666 & ~old


def test_gzip_traces_are_enriched_in_place(tmp_path):
    out = tmp_path / "traces"
    report = run_job(out, "--cycles", "2", "--gzip")
    for path in report["traces"]:
        assert path.endswith(".json.gz") and gzip.decompress(Path(path).read_bytes())
        assert_enriched(path, plain_copy(out, path))


def test_ENOSPC_is_what_the_injection_raises():
    """The injected fault is the real one (an OSError with errno ENOSPC), not a stand-in the code could special-case."""
    sys.path.insert(0, str(JOB.parent))
    from profiler_faults import _FullDisk

    r, w = os.pipe()
    os.close(r)
    with pytest.raises(OSError) as exc:
        _FullDisk(w).write(b"x")
    assert exc.value.errno == errno.ENOSPC
