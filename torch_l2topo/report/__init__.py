"""Writing a calibration up: the Markdown report and its figures. Imports the root modules, analysis/
and geometry/.
"""
