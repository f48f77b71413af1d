"""Measuring the map on the GPU: kernel launches over both backends, the probes' host side, calibrate()
with its self-checks, repeats and cache. Imports the root modules only; everything that launches a
kernel to measure the L2 lives here.
"""
