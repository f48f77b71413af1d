"""Partition maps of tensors: which L2 partition homes each 256-byte block (docs/usage.md, Placing work). maps:
the entry point, partition_map(), with its per-GPU setup; decision: classify_blocks, the decision from probe
times; pairs: the SM pairs and probe plan; calibrated: what is derived once per calibration and kept on disk;
check: the independent re-probe; cache: the per-allocation cache.
"""
