"""Which device and which SM: fingerprints, their evaluation, the registry, hashed export and
self-localization. Imports the root modules, measure/ and analysis/.
"""
