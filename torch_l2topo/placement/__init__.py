"""Putting the map to work in kernels: plans, plan tensors, @sm_aware, partition maps of tensors and
green contexts. Imports the root modules, measure/ and analysis/.
"""
