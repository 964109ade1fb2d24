"""Writing a GGUF model as a split model: ``NAME-00001-of-0000N.gguf`` ... ``NAME-0000N-of-0000N.gguf``.

The layout is the one llama.cpp's ``gguf-split`` and gguf-py's writer produce (and the one the engine's
reader opens as one model, ``native/src/gguf.h``): every part is a complete GGUF file whose header says
``split.no`` (u16, from 0), ``split.count`` (u16) and ``split.tensors.count`` (i32, all parts together);
the metadata is in the first part and the tensors are spread over the parts in file order, a new part
starting when ``max_tensors`` or ``max_size`` would be passed. Tensor bytes are copied unchanged, so a
split model computes exactly what the file it was split from computes.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

__all__ = ["SplitError", "model_files", "parse_size", "part_names", "split_model"]


class SplitError(ValueError):
    """The split cannot be made as asked (limits that leave one part, an input that is already split)."""


_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_size(text: str) -> int:
    """Bytes from ``"512M"``, ``"2G"``, ``"100K"`` or a plain number of bytes (``--split-max-size``)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m or float(m.group(1)) <= 0:
        raise SplitError(f"{text!r} is not a size: give bytes or a number with K, M, G or T (e.g. 512M, 2G)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def part_names(out: Path, n: int) -> list[Path]:
    """The names of the n parts of a split model written as ``out`` (``out``'s stem and suffix)."""
    return [out.with_name(f"{out.stem}-{k:05d}-of-{n:05d}{out.suffix}") for k in range(1, n + 1)]


def model_files(first: Path, split_count: int) -> list[Path]:
    """The files of the model whose first file is ``first`` and whose header says ``split.count``:
    ``[first]`` for a plain file, every part (as the engine finds them) for a split model."""
    if split_count <= 1:
        return [first]
    m = re.fullmatch(r"(.*)-00001-of-(\d{5})(\.gguf)", first.name)
    if not m or int(m.group(2)) != split_count:
        raise SplitError(
            f"{first} is the first of {split_count} parts of a split model, but its name does not end in "
            f"-00001-of-{split_count:05d}.gguf, so the other parts cannot be found"
        )
    return part_names(first.with_name(m.group(1) + m.group(3)), split_count)


def split_model(src: str | Path, out: str | Path, *, max_tensors: int = 0, max_size: int = 0) -> list[Path]:
    """Write the GGUF model ``src`` as a split model named after ``out``; return the parts' paths.

    A new part starts before a tensor that would make the current part hold more than ``max_tensors``
    tensors or ``max_size`` bytes of tensor data (every part holds at least one tensor). The parts are
    written under a temporary folder next to ``out`` and appear under their names only when complete.
    """
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    if max_tensors <= 0 and max_size <= 0:
        raise SplitError("give a limit per part: --split-max-tensors N or --split-max-size SIZE")
    src, out = Path(src), Path(out)
    r = GGUFReader(str(src))
    if "split.count" in r.fields and int(r.fields["split.count"].contents()) > 1:
        raise SplitError(f"{src} is already one part of a split model")
    arch = r.fields["general.architecture"].contents()
    tmp = out.parent / f".{out.name}.split-{os.getpid()}"
    tmp.mkdir(parents=True, exist_ok=False)
    try:
        w = GGUFWriter(tmp / out.name, arch, split_max_tensors=max_tensors, split_max_size=max_size)
        try:
            for name, field in r.fields.items():
                if name.startswith(("GGUF.", "split.")) or name == "general.architecture":
                    continue
                if name == "general.alignment":
                    w.add_custom_alignment(int(field.contents()))
                    continue
                vtype = field.types[0]
                if vtype == GGUFValueType.ARRAY and len(field.types) > 2:
                    raise SplitError(
                        f"{src}: metadata {name!r} is an array of arrays, which this writer does not copy"
                    )
                sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
                w.add_key_value(name, field.contents(), vtype, sub_type=sub)
            for t in r.tensors:
                w.add_tensor_info(t.name, t.data.shape, t.data.dtype, int(t.n_bytes), raw_dtype=t.tensor_type)
            n = len(w.tensors)
            if n < 2:
                raise SplitError(
                    f"the limits keep all {len(r.tensors)} tensors of {src} in one part; lower "
                    "--split-max-tensors or --split-max-size"
                )
            w.write_header_to_file()
            w.write_kv_data_to_file()
            w.write_ti_data_to_file()
            for t in r.tensors:
                w.write_tensor_data(t.data)
        finally:
            w.close()
        names = part_names(out, n)
        for p in names:
            os.replace(tmp / p.name, p)
        return names
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
