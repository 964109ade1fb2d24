"""Random tiny Hugging Face models converted to GGUF by llama.cpp's own converter (a reference strata did not write).

``ensure_converter()`` fetches the ``llama-cpp-python`` source distribution with pip (the version the
vocabulary tests use), keeps only ``convert_hf_to_gguf.py``, its ``conversion`` package and its
``gguf-py`` under ``<strata cache>/llama-convert/<version>/`` and returns that folder; it is never
committed. ``convert(hf_dir, {outtype: path})`` runs it in a subprocess (its ``gguf-py`` must not replace
the test process's ``gguf``).

The converter names a byte-level BPE vocabulary's pre-tokenizer by the hash of how the tokenizer splits
a fixed text, and knows only published tokenizers' hashes; the random models here carry strata's own
small vocabulary, so the driver names its pre-tokenizer (``qwen2``) instead of failing on the unknown
hash, and families that look for a SentencePiece model first (llama, granite) are sent to the BPE
vocabulary the folder has (glm4moe's, which looks up GLM's own special tokens, too). The tokenizer is not what these files are checked for: the engine is given
token ids.

    python tests/_hf_convert.py        # fetch the converter ahead of the tests (make test does it on demand)
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _llama_vocab import VERSION, download_sdist

from strata.model._cache import cache_dir, file_lock

__all__ = ["convert", "ensure_converter"]

_ROOT = "/vendor/llama.cpp/"
_KEEP = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/gguf/")

# Run in the converter's folder: its gguf-py first on the path, the pre-tokenizer named, then its main().
_DRIVER = """
import runpy, sys
root = sys.argv[1]
sys.path.insert(0, root)
sys.path.insert(1, root + "/gguf-py")
import conversion.base as base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
def no_spm(self, *args, **kwargs):
    raise FileNotFoundError("a byte-level BPE vocabulary (tokenizer.json), no SentencePiece model")
base.TextModel._set_vocab_sentencepiece = no_spm
base.TextModel._set_vocab_llama_hf = no_spm
base.TextModel._set_vocab_glm = base.TextModel._set_vocab_gpt2  # GLM's needs GLM's own special tokens
hf_dir, jobs = sys.argv[2], sys.argv[3:]
for out, outtype in zip(jobs[::2], jobs[1::2]):
    sys.argv = ["convert_hf_to_gguf.py", hf_dir, "--outfile", out, "--outtype", outtype]
    runpy.run_path(root + "/convert_hf_to_gguf.py", run_name="__main__")
"""


def _complete(d: Path) -> bool:
    return (
        (d / "convert_hf_to_gguf.py").is_file()
        and (d / "gguf-py/gguf/__init__.py").is_file()
        and (d / "conversion/__init__.py").is_file()
    )


def ensure_converter() -> Path:
    """The folder holding llama.cpp's converter; raises RuntimeError (with pip's words) when it cannot fetch it."""
    dest = cache_dir(f"llama-convert/{VERSION}")
    if _complete(dest):
        return dest
    with file_lock(dest / ".lock"):
        if _complete(dest):
            return dest
        with tempfile.TemporaryDirectory(prefix="strata-llama-convert-") as tmp:
            sdist = download_sdist(Path(tmp))
            with tarfile.open(sdist) as tar:
                for m in tar:
                    if not m.isfile() or _ROOT not in m.name:
                        continue
                    rel = m.name.split(_ROOT, 1)[1]
                    if not any(rel == k or (k.endswith("/") and rel.startswith(k)) for k in _KEEP):
                        continue
                    src = tar.extractfile(m)
                    assert src is not None
                    out = dest / rel
                    out.parent.mkdir(parents=True, exist_ok=True)
                    part = out.with_name(out.name + ".part")
                    part.write_bytes(src.read())
                    part.replace(out)
    if not _complete(dest):
        raise RuntimeError(
            f"llama-cpp-python {VERSION} does not carry convert_hf_to_gguf.py and its packages"
        )
    return dest


def convert(hf_dir: Path, outs: dict[str, Path]) -> None:
    """Convert the saved model in hf_dir with llama.cpp's converter, once per {outtype: path} (f32, f16),
    in one process (the converter's imports are most of its time)."""
    root = ensure_converter()
    jobs = [str(a) for t, out in outs.items() for a in (out, t)]
    p = subprocess.run(
        [sys.executable, "-c", _DRIVER, str(root), str(hf_dir), *jobs],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if p.returncode != 0 or not all(out.is_file() for out in outs.values()):
        raise RuntimeError(
            f"llama.cpp's converter failed on {hf_dir}: {(p.stderr or p.stdout).strip()[-1500:]}"
        )


if __name__ == "__main__":
    print(ensure_converter())
