"""``python -m strata_bench``: the ``strata-bench`` command, for hosts where it is not installed as a script."""

from __future__ import annotations

import sys

from .cli import exit_process, main

sys.exit(exit_process(main()))
