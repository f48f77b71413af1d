"""The L2 geometry suite: detectors (pure numpy), the experiments that run them (suite, on chases and the
driver binding), their text summary and their figures. Imports the root modules, measure/, analysis/ and
placement/ (partition maps).
"""
