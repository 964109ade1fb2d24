"""llama.cpp's tokenizer test vocabularies, fetched from PyPI into the cache folder (never committed).

The ``llama-cpp-python`` source distribution carries llama.cpp's vocab-only GGUF files
(``vendor/llama.cpp/models/ggml-vocab-NAME.gguf``) with texts (``.inp``) and the ids llama.cpp
produces for them (``.out``). ``ensure_llama_vocab()`` downloads the sdist once with pip, keeps only
those files under ``<strata cache>/llama-vocab/<version>/`` and returns that folder.

    python tests/_llama_vocab.py        # fetch them ahead of the tests (make test does it on demand)
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from strata.model._cache import cache_dir, file_lock

__all__ = ["NAMES", "VERSION", "download_sdist", "ensure_llama_vocab", "read_cases"]

VERSION = "0.3.36"
# the vocabularies checked: byte-level BPE with several pre-tokenizers, and SentencePiece
NAMES = (
    "qwen2",
    "llama-bpe",
    "gpt-2",
    "llama-spm",
    "phi-3",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "starcoder",
    "refact",
    "mpt",
    "command-r",
    "qwen35",
)
_SEP = "\n__ggml_vocab_test__\n"


def download_sdist(folder: Path) -> Path:
    """The llama-cpp-python source distribution, downloaded by pip into folder; RuntimeError with pip's words."""
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            "--disable-pip-version-check",
            "-q",
            "-d",
            str(folder),
            f"llama-cpp-python=={VERSION}",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    sdists = list(folder.glob("llama_cpp_python-*.tar.gz"))
    if p.returncode != 0 or not sdists:
        raise RuntimeError(
            f"pip could not download llama-cpp-python=={VERSION}: {(p.stderr or p.stdout).strip()[-800:]}"
        )
    return sdists[0]


def _complete(d: Path) -> bool:
    return all((d / f"ggml-vocab-{n}.gguf{ext}").is_file() for n in NAMES for ext in ("", ".inp", ".out"))


def ensure_llama_vocab() -> Path:
    """The folder with the vocabularies; raises RuntimeError (with pip's words) when it cannot fetch them."""
    dest = cache_dir(f"llama-vocab/{VERSION}")
    if _complete(dest):
        return dest
    with file_lock(dest / ".lock"):
        if _complete(dest):
            return dest
        with tempfile.TemporaryDirectory(prefix="strata-llama-vocab-") as tmp:
            sdist = download_sdist(Path(tmp))
            wanted = {f"ggml-vocab-{n}.gguf{ext}" for n in NAMES for ext in ("", ".inp", ".out")}
            with tarfile.open(sdist) as tar:
                for m in tar:
                    name = m.name.rsplit("/", 1)[-1]
                    if m.isfile() and name in wanted and "/vendor/llama.cpp/models/" in m.name:
                        src = tar.extractfile(m)
                        assert src is not None
                        part = dest / (name + ".part")
                        part.write_bytes(src.read())
                        part.replace(dest / name)
    if not _complete(dest):
        raise RuntimeError(f"llama-cpp-python {VERSION} does not carry every vocabulary of {NAMES}")
    return dest


def read_cases(folder: Path, name: str) -> list[tuple[str, list[int]]]:
    """(text, llama.cpp's ids) pairs of one vocabulary, split the way llama.cpp's test reads them."""
    raw = (folder / f"ggml-vocab-{name}.gguf.inp").read_bytes().decode("utf-8")
    texts = raw.split(_SEP)
    outs = (folder / f"ggml-vocab-{name}.gguf.out").read_text(encoding="utf-8").split("\n")
    outs = outs[: len(texts)]
    if len(outs) != len(texts):
        raise ValueError(f"{name}: {len(texts)} texts but {len(outs)} expected id lines")
    return [(t, [int(x) for x in o.split()]) for t, o in zip(texts, outs, strict=True)]


if __name__ == "__main__":
    print(ensure_llama_vocab())
