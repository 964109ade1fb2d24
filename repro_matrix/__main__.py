"""``python -m repro_matrix``: the same as the ``repro_matrix`` command."""

from __future__ import annotations

import sys

from .cli import main

sys.exit(main())
