"""Explaining a map on the CPU: the NUCA model, per-SM and per-line labels, structure (twins, GPCs),
slice classes, comparisons and the summary. Pure numpy/scipy from a saved Topology: imports the
root modules only, never measure/.
"""
