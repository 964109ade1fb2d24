"""repro_matrix: sweep strata's engine configurations, find the failing ones, prove replies stay identical.

``repro_matrix run MATRIX`` runs every cell of a matrix (fresh engines through ``strata serve``),
``repro_matrix bisect DIR`` pins a failure's boundaries, ``repro_matrix report DIR`` writes the scrubbed
bug report, ``repro_matrix env`` prints the environment. See ``repro_matrix._matrix`` for the format.
"""

from __future__ import annotations

from ._bisect import BisectResult, FailRange, bisect_ranges
from ._matrix import Cell, Matrix, MatrixError, load_matrix, shard_cells
from ._scrub import Removed, Scrubber, scrub
from ._verdict import Difference, Verdict, first_difference, judge

__all__ = [
    "BisectResult",
    "Cell",
    "Difference",
    "FailRange",
    "Matrix",
    "MatrixError",
    "Removed",
    "Scrubber",
    "Verdict",
    "bisect_ranges",
    "first_difference",
    "judge",
    "load_matrix",
    "scrub",
    "shard_cells",
]
