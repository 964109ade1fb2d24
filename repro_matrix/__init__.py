"""repro_matrix: sweep strata's engine configurations, find the failing ones, prove replies stay identical.

``repro_matrix run MATRIX`` runs every cell of a matrix (fresh engines through ``strata serve``; a share
of them with ``--shard K/N``, JUnit and a Markdown summary with ``--junit``/``--summary``),
``repro_matrix merge`` combines the shards, ``repro_matrix bisect DIR`` pins a failure's boundaries and
``bisect --commits GOOD..BAD CELL`` the first bad commit, ``repro_matrix report DIR`` writes the scrubbed
bug report, ``repro_matrix plot DIR`` the heat map, ``repro_matrix env`` prints the environment. See
``repro_matrix._matrix`` for the format and ``repro_matrix._ci`` for the exit statuses."""

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
