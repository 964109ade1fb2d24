"""strata_bench: measure strata and its peers (llama.cpp, any OpenAI-compatible server) side by side.

The command is ``strata-bench`` (``strata_bench.cli:main``): ``run``, ``serve-bench``, ``compare``,
``plot`` and ``show``. Results are self-describing JSONL records (``strata_bench._records``).
"""

from __future__ import annotations

__all__: list[str] = []
