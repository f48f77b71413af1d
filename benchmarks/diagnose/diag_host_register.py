"""Which host memory cudaHostRegister page-locks on this machine (the profiler's record spool, spool.py, wants
memory that a second process maps): each kind of buffer is registered in a fresh process (a failed call leaves
an error that the next CUDA call would report), and the result code printed.

    python benchmarks/diagnose/diag_host_register.py [--mib 4]
"""
from __future__ import annotations

import argparse
import subprocess
import sys

KINDS = ("anonymous_private", "anonymous_shared", "devshm_file", "devshm_file_prefaulted", "memfd",
         "torch_share_memory", "numpy_heap")


def _buffer(kind: str, n_bytes: int):
    import mmap
    import os
    import tempfile

    import numpy as np
    import torch

    if kind == "anonymous_private":
        return mmap.mmap(-1, n_bytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if kind == "anonymous_shared":
        return mmap.mmap(-1, n_bytes, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
    if kind.startswith("devshm_file"):
        fd, _ = tempfile.mkstemp(dir="/dev/shm")
        os.ftruncate(fd, n_bytes)
        mm = mmap.mmap(fd, n_bytes)
        if kind.endswith("prefaulted"):
            mm[:] = b"\0" * n_bytes
        return mm
    if kind == "memfd":
        fd = os.memfd_create("l2topo-probe")
        os.ftruncate(fd, n_bytes)
        return mmap.mmap(fd, n_bytes)
    if kind == "torch_share_memory":
        return torch.zeros(n_bytes // 8, dtype=torch.int64).share_memory_()
    return np.zeros(n_bytes // 8, np.int64)


def probe(kind: str, n_bytes: int) -> None:
    import numpy as np
    import torch

    buf = _buffer(kind, n_bytes)
    t = buf if isinstance(buf, torch.Tensor) else torch.from_numpy(np.frombuffer(buf, dtype=np.int64))
    torch.cuda.init()
    cudart = torch.cuda.cudart()
    for flags in (0, 1):
        err = cudart.cudaHostRegister(t.data_ptr(), n_bytes, flags)
        code = int(err)
        if code == 0:
            src = torch.arange(n_bytes // 8, device="cuda")
            t.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            ok = bool((t == src.cpu()).all())
            cudart.cudaHostUnregister(t.data_ptr())
            print(f"{kind:24s} flags={flags}: registered, async copy correct: {ok}", flush=True)
        else:
            print(f"{kind:24s} flags={flags}: error {code}", flush=True)
            return


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=float, default=4.0)
    p.add_argument("--kind", choices=KINDS, default=None, help="probe one kind here (the driver runs each alone)")
    args = p.parse_args(argv)
    n_bytes = int(args.mib * 2**20) // 4096 * 4096
    if args.kind:
        probe(args.kind, n_bytes)
        return
    for kind in KINDS:
        subprocess.run([sys.executable, __file__, "--kind", kind, "--mib", str(args.mib)], check=False)


if __name__ == "__main__":
    main()
