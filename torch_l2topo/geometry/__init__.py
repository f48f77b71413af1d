"""The L2 geometry suite: detectors (pure numpy), the experiments that run them, and their figures.
Imports the root modules, measure/, analysis/ and placement/ (partition maps).
"""
