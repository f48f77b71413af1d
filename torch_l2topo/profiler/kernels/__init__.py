"""Whole-model profiling: instrumented twins of the process's Triton kernels (ptx.py, twins.py)."""
