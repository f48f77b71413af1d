"""How many CTAs of a compiled kernel one SM holds at once: the bound on a persistent grid's CTAs per SM.

From the compiled kernel's registers per thread, shared memory and threads per CTA against the device's
limits (the CUDA occupancy calculator's arithmetic), or from the driver's own occupancy API through cuda-python
(cuOccupancyMaxActiveBlocksPerMultiprocessor) where it is installed. resident_ctas() is pure arithmetic and is
tested on CPU; triton_occupancy() reads a compiled Triton kernel (after its first compile) on a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

REGISTER_GRANULE = 256     # registers are allocated per warp in units of 256 (cc 8.x and 9.x)
SHARED_RESERVED = 1024     # bytes of shared memory the system reserves per CTA (cc 8.x and 9.x)
# Resident CTAs per SM by compute capability (CUDA programming guide, "Technical Specifications").
MAX_CTAS_PER_SM = {(8, 0): 32, (8, 6): 16, (8, 7): 16, (8, 9): 24, (9, 0): 32, (10, 0): 32, (12, 0): 32}


@dataclass(frozen=True)
class SmLimits:
    """One SM's resources: threads, 32-bit registers, shared memory (bytes) and CTAs."""

    threads: int
    registers: int
    shared_bytes: int
    ctas: int

    @classmethod
    def of(cls, device) -> SmLimits:
        import torch

        p = torch.cuda.get_device_properties(device)
        return cls(threads=p.max_threads_per_multi_processor, registers=p.regs_per_multiprocessor,
                   shared_bytes=p.shared_memory_per_multiprocessor,
                   ctas=MAX_CTAS_PER_SM.get((p.major, p.minor), 16))


def resident_ctas(limits: SmLimits, *, threads_per_cta: int, registers_per_thread: int, shared_bytes: int) -> int:
    """CTAs of one kernel an SM holds at once: the tightest of the thread, register, shared-memory and CTA
    limits (0: the kernel cannot run, e.g. more shared memory than the SM has)."""
    if threads_per_cta < 1 or registers_per_thread < 0 or shared_bytes < 0:
        raise ValueError(f"bad kernel resources: {threads_per_cta} threads, {registers_per_thread} registers, "
                         f"{shared_bytes} B shared")
    warps = -(-threads_per_cta // 32)
    per_warp = -(-max(registers_per_thread, 1) * 32 // REGISTER_GRANULE) * REGISTER_GRANULE
    by_threads = limits.threads // (warps * 32)
    by_registers = limits.registers // (per_warp * warps)
    by_shared = limits.shared_bytes // (shared_bytes + SHARED_RESERVED)
    return max(0, min(by_threads, by_registers, by_shared, limits.ctas))


def triton_occupancy(compiled, device) -> int:
    """Resident CTAs per SM of a compiled Triton kernel (what `kernel[grid](...)` returns): the driver's answer
    through cuda-python when it is installed, else resident_ctas() on the kernel's metadata."""
    compiled._init_handles()
    threads = 32 * compiled.metadata.num_warps
    shared = compiled.metadata.shared
    try:
        from cuda.bindings import driver
    except ImportError:
        driver = None
    if driver is not None:
        err, blocks = driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(driver.CUfunction(compiled.function),
                                                                          threads, shared)
        if err == driver.CUresult.CUDA_SUCCESS:
            return int(blocks)
    return resident_ctas(SmLimits.of(device), threads_per_cta=threads, registers_per_thread=compiled.n_regs,
                         shared_bytes=shared)
