"""llama.cpp reads the models strata makes: the same token ids, and logits that agree with the reference.

Marked ``llama_cpp``: `make test` leaves it out (llama.cpp is not a dependency) and `make test-llama-cpp`
runs it. It needs llama.cpp's Python binding importable and ``STRATA_LLAMA_CPP_LIB`` set to the folder
holding ``libllama.so`` (a llama.cpp build, e.g. from the ``llama-cpp-python`` source package); asked
for without them, it fails saying which is missing.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np
import pytest
from reference import Reference

from strata.model import ensure_model
from strata.model._routing import PROMPT_TEXT
from strata.model.cli import _gguf_tokenizer

pytestmark = pytest.mark.llama_cpp


def _binding() -> ModuleType:
    lib = os.environ.get("STRATA_LLAMA_CPP_LIB")
    if not lib:
        pytest.fail(
            "set STRATA_LLAMA_CPP_LIB to a folder with libllama.so to run the llama.cpp tests", pytrace=False
        )
    os.environ.setdefault("LLAMA_CPP_LIB_PATH", lib)
    try:
        return importlib.import_module("llama_cpp")
    except ImportError as e:
        pytest.fail(f"llama.cpp's Python binding (llama_cpp) is not importable: {e}", pytrace=False)


@pytest.fixture(scope="module", params=["f32", "q8_0"])
def llm(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    llama_cpp = _binding()
    path = ensure_model("tiny", request.param, 0)
    m = llama_cpp.Llama(model_path=str(path), logits_all=True, n_ctx=512, n_threads=2, verbose=False)
    yield request.param, path, m
    m.close()


def test_llama_cpp_tokenizes_like_strata(llm) -> None:  # type: ignore[no-untyped-def]
    _, path, m = llm
    tok = _gguf_tokenizer(path)
    for text in (
        PROMPT_TEXT,
        "def f(x):\n    return {'a': x ** 2}  # 123 4567 ünïcødé 日本語\r\n\t done",
        "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
    ):
        assert m.tokenize(text.encode(), add_bos=False, special=True) == tok.encode(text).ids
    assert m.detokenize([m.token_eos()], special=True) == b"<|im_end|>"


def test_llama_cpp_logits_agree_with_the_reference(llm) -> None:  # type: ignore[no-untyped-def]
    quant, path, m = llm
    ids = _gguf_tokenizer(path).encode(PROMPT_TEXT).ids[:64]
    m.eval(ids)
    got = np.array(m.scores[: len(ids)])
    want = Reference(path).forward(ids)
    err = np.abs(got - want).max(axis=1) / np.abs(want).max(axis=1)
    print(f"llama.cpp vs reference, {quant}: worst {err.max():.2e}, median {np.median(err):.2e}")
    if quant == "f32":
        assert err.max() < 1e-3, f"worst position {int(err.argmax())}: {err.max():.2e}"
    else:
        # 8-bit activations move router logits; a near-tie can pick another expert at a few positions
        assert np.median(err) < 3e-2 and (err < 5e-2).mean() > 0.8, f"median {np.median(err):.2e}"
    assert (got.argmax(1) == want.argmax(1)).mean() > 0.9


def test_llama_cpp_opens_a_split_model_strata_wrote(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from strata.model._split import split_model

    llama_cpp = _binding()
    path = ensure_model("tiny", "q8_0", 0)
    parts = split_model(path, tmp_path / "tiny.gguf", max_tensors=10)
    ids = _gguf_tokenizer(path).encode(PROMPT_TEXT).ids[:32]
    scores = []
    for p in (path, parts[0]):
        m = llama_cpp.Llama(model_path=str(p), logits_all=True, n_ctx=256, n_threads=2, verbose=False)
        m.eval(ids)
        scores.append(np.array(m.scores[: len(ids)]))
        m.close()
    # the same bytes in other files: llama.cpp computes the same logits from both
    assert np.array_equal(scores[0], scores[1])
