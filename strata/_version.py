"""strata's version: the one place it is written.

pyproject.toml reads it (a dynamic version, through scikit-build-core's regex provider) and
native/CMakeLists.txt compiles it into the library (``strata_version()``); tests/test_version.py checks
that the three agree.
"""

__version__ = "0.1.0"
