"""Fixtures shared by the test files: the tiny model and its tokenizer.

The tiny model is made once per machine (strata.model.ensure_model caches it by preset, quant and seed)
and handed to every test that names the fixture; a test that needs another preset or quant calls
ensure_model itself.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.model import ensure_model
from strata.tokenizer import Tokenizer


@pytest.fixture(scope="session")
def tiny() -> Path:
    """The tiny preset's model file (default quant, seed 0)."""
    return Path(ensure_model("tiny"))


@pytest.fixture(scope="session")
def tiny_tok(tiny: Path) -> Tokenizer:
    """The tokenizer read from the tiny model's vocabulary."""
    return Tokenizer.from_gguf(tiny)
