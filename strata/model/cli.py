"""``strata model make|info|routing``: make synthetic models and describe GGUF files."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "describe"]


def add_parser(subparsers: Any) -> None:
    from ._presets import PRESETS
    from ._writer import QUANTS

    p = subparsers.add_parser("model", help="make a synthetic model, or describe a GGUF file")
    sub = p.add_subparsers(dest="model_command", metavar="ACTION")

    mk = sub.add_parser(
        "make",
        help="write a synthetic qwen3moe GGUF (random weights, real tokenizer and chat template)",
        description="Write a synthetic qwen3moe GGUF. Without --out the model goes to the strata cache "
        "(STRATA_CACHE_DIR overrides) and is reused from there; its path is printed last.",
    )
    mk.add_argument("--preset", default="tiny", choices=sorted(PRESETS), help="model size (default: tiny)")
    mk.add_argument(
        "--quant",
        default=None,
        type=str.lower,
        choices=QUANTS,
        help="weight type or mix (default: the preset's, q8_0)",
    )
    mk.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    mk.add_argument("--out", type=Path, default=None, help="write here instead of the cache")
    mk.add_argument("--force", action="store_true", help="remake even if the cached file exists")
    mk.add_argument(
        "--zipf-alpha",
        type=float,
        default=None,
        help="expert popularity skew: p(rank r) ~ 1/r**A in each layer (default: the preset's, 0.8; 0 = uniform)",
    )
    mk.add_argument(
        "--route-noise",
        type=float,
        default=None,
        help="std of the token-dependent part of the router logits (default: the preset's, 1.25)",
    )
    _split_limits(mk, "also write the model as a split model (NAME-00001-of-0000N.gguf ...): ")
    mk.set_defaults(func=_cmd_make)

    sp = sub.add_parser(
        "split",
        help="write a GGUF model as a split model (NAME-00001-of-0000N.gguf ...), as llama.cpp's gguf-split does",
        description="Write FILE as a split model: every part a GGUF file, the metadata in the first, the "
        "tensors spread over the parts unchanged. Open it by its first part.",
    )
    sp.add_argument("file", type=Path, help="the model to split")
    sp.add_argument(
        "out", type=Path, nargs="?", default=None, help="NAME.gguf of the parts (default: FILE's name)"
    )
    _split_limits(sp, "")
    sp.set_defaults(func=_cmd_split)

    info = sub.add_parser("info", help="architecture, dimensions, tensor types and expert sizes of a GGUF")
    info.add_argument("file", type=Path)
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(func=_cmd_info)

    rt = sub.add_parser(
        "routing",
        help="route a real text through a model: per-layer spread and the LRU expert-cache hit rates",
    )
    rt.add_argument("file", type=Path)
    rt.add_argument("--tokens", type=int, default=1024, help="tokens of text to route (default: 1024)")
    rt.add_argument("--layers", type=int, default=None, help="only the first N layers")
    rt.set_defaults(func=_cmd_routing)

    p.set_defaults(func=lambda a: (p.print_help(), 2)[1])


def _split_limits(p: Any, what: str) -> None:
    from ._split import parse_size

    p.add_argument(
        "--split-max-tensors",
        type=int,
        default=0,
        metavar="N",
        help=what + "at most N tensors in each part",
    )
    p.add_argument(
        "--split-max-size",
        type=_size_arg(parse_size),
        default=0,
        metavar="SIZE",
        help=what + "at most SIZE bytes of tensor data in each part (512M, 2G)",
    )


def _size_arg(parse: Callable[[str], int]) -> Callable[[str], int]:
    def size(text: str) -> int:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return size


def _write_split(src: Path, out: Path, args: argparse.Namespace, say: Callable[[str], None]) -> Path:
    """Split src into out's parts; say what was written and return the first part."""
    from ._split import split_model

    parts = split_model(src, out, max_tensors=args.split_max_tensors, max_size=args.split_max_size)
    total = sum(p.stat().st_size for p in parts)
    say(f"split into {len(parts)} parts ({total / 2**20:.1f} MiB): {parts[0].name} .. {parts[-1].name}")
    return parts[0]


def _cmd_split(args: argparse.Namespace) -> int:
    from ._split import SplitError

    def say(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    if not args.file.is_file():
        print(f"strata model split: no such file: {args.file}", file=sys.stderr)
        return 1
    try:
        first = _write_split(args.file, args.out or args.file, args, say)
    except (SplitError, OSError) as e:
        print(f"strata model split: {e}", file=sys.stderr)
        return 1
    print(first)
    return 0


class _Progress:
    """Tensors and bytes written, on stderr: at the start, at every tenth of the bytes, at least every
    5 s while it writes, and at the end."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say
        self.t0 = self.last = time.monotonic()
        self.tenth = -1

    def __call__(self, n: int, n_total: int, done: int, total: int) -> None:
        now = time.monotonic()
        tenth = 10 * done // max(total, 1)
        if tenth == self.tenth and now - self.last < 5.0 and n < n_total:
            return
        self.tenth, self.last = tenth, now
        unit, scale = ("GiB", 2**30) if total >= 2**30 else ("MiB", 2**20)
        self.say(
            f"writing: {n}/{n_total} tensors, {done / scale:.1f} of {total / scale:.1f} {unit} "
            f"({100 * done / max(total, 1):.0f}%, {now - self.t0:.0f} s)"
        )


def _cmd_make(args: argparse.Namespace) -> int:
    from ._presets import get_preset
    from ._writer import RoutingCollapsedError, make_model, model_cache_path

    def say(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    quant = args.quant or get_preset(args.preset).default_quant
    shape = {
        k: v for k, v in (("zipf_alpha", args.zipf_alpha), ("route_noise", args.route_noise)) if v is not None
    }
    out = args.out
    if out is None:
        out = model_cache_path(args.preset, quant, args.seed, **shape)
        if out.exists() and not args.force:
            say(f"already made: {out}")
            return _split_made(out, args, say, keep=True)
    t0 = time.perf_counter()

    # the file is written under a temporary .part name and removed on any error or interrupt: a
    # SIGTERM or SIGHUP (whose default ends the process on the spot, leaving up to 16 GB behind) is
    # turned into an exit that unwinds through that cleanup; SIGINT too, so that a stop that lands
    # where Python swallows the exception (a callback, a finalizer) is remembered and raised again at
    # the next progress step instead of letting the writer run to the end
    stopped: list[int] = []

    def _stop(signum: int, _frame: object) -> None:
        stopped.append(signum)
        raise SystemExit(128 + signum)

    def _progress(n: int, n_total: int, done: int, total: int) -> None:
        if stopped:  # the exit was raised where it got swallowed (a finalizer): raise it again here
            raise SystemExit(128 + stopped[0])
        show(n, n_total, done, total)

    show = _Progress(say)

    old = {sig: signal.signal(sig, _stop) for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    try:
        path = make_model(args.preset, quant, args.seed, out, say=say, progress=_progress, **shape)
    except (ValueError, NotImplementedError, RoutingCollapsedError) as e:
        print(f"strata model make: {e}", file=sys.stderr)
        return 1
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    say(f"made in {time.perf_counter() - t0:.1f} s, {path.stat().st_size / 2**20:.1f} MiB")
    return _split_made(path, args, say, keep=args.out is None)


def _split_made(path: Path, args: argparse.Namespace, say: Callable[[str], None], keep: bool) -> int:
    """Print the made model's path, or split it first when asked (--split-max-*): the parts replace a
    file written to --out, and sit beside the cached file that ``ensure_model`` reuses."""
    if args.split_max_tensors or args.split_max_size:
        from ._split import SplitError

        try:
            first = _write_split(path, path, args, say)
        except (SplitError, OSError) as e:
            print(f"strata model make: {e}", file=sys.stderr)
            return 1
        if not keep:
            path.unlink()
        path = first
    print(path)
    return 0


def _blocks(path: Path) -> tuple[str | None, str | None]:
    """The engine's own account of the file: (family and blocks, None), or (None, why it cannot run it)."""
    import ctypes

    from .. import _cdefs as C

    buf = ctypes.create_string_buffer(1024)
    status = C.strata_model_describe(str(path).encode(), buf, len(buf))
    text = buf.value.decode(errors="replace")
    return (text, None) if status == 0 else (None, text)


def describe(path: Path) -> dict[str, Any]:
    """What ``strata model info`` prints, as a dict."""
    from gguf import GGUFReader

    from ._split import model_files

    if not path.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    try:
        r = GGUFReader(str(path))
    except Exception as e:  # gguf-py reports truncation and corruption as assorted numpy errors
        raise ValueError(
            f"not a readable GGUF file (truncated or corrupt?): {e}; make a fresh one with `strata model make`"
        ) from e

    def field(key: str) -> Any:
        f = r.fields.get(key)
        return None if f is None else f.contents()

    arch = field("general.architecture")
    dims = {}
    for key in (
        "context_length",
        "embedding_length",
        "block_count",
        "feed_forward_length",
        "attention.head_count",
        "attention.head_count_kv",
        "attention.key_length",
        "attention.value_length",
        "rope.freq_base",
        "attention.layer_norm_rms_epsilon",
        "expert_count",
        "expert_used_count",
        "expert_feed_forward_length",
    ):
        v = field(f"{arch}.{key}")
        if v is not None:
            dims[key] = v
    tokens = r.fields.get("tokenizer.ggml.tokens")
    tensors = []
    resident = 0
    expert_bytes: dict[int, int] = {}
    n_expert = int(dims.get("expert_count") or 0)
    parts = model_files(path, int(field("split.count") or 1))
    readers = [r] + [GGUFReader(str(p)) for p in parts[1:]]  # a missing part: FileNotFoundError
    for t in (t for rd in readers for t in rd.tensors):
        nbytes = int(t.n_bytes)
        tensors.append(
            {"name": t.name, "type": t.tensor_type.name, "shape": [int(x) for x in t.shape], "bytes": nbytes}
        )
        if "_exps." in t.name and n_expert:
            layer = int(t.name.split(".")[1])
            expert_bytes[layer] = expert_bytes.get(layer, 0) + nbytes // n_expert
        else:
            resident += nbytes
    blocks, unsupported = _blocks(path)
    return {
        "file": str(path),
        "parts": [str(p) for p in parts],
        "architecture": arch,
        "blocks": blocks,
        "unsupported": unsupported,
        "name": field("general.name"),
        "file_type": field("general.file_type"),
        "dimensions": dims,
        "vocab_size": len(tokens.data) if tokens is not None else None,
        "tokenizer": {"model": field("tokenizer.ggml.model"), "pre": field("tokenizer.ggml.pre")},
        "resident_bytes": resident,
        "expert_bytes_per_layer": [expert_bytes[k] for k in sorted(expert_bytes)],
        "tensors": tensors,
    }


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


def _describe_or_report(path: Path, command: str) -> dict[str, Any] | None:
    """``describe(path)``; when the file cannot be read, say so on stderr as ``command`` and return None."""
    try:
        return describe(path)
    except (OSError, ValueError) as e:
        print(f"{command}: cannot read {path}: {e}", file=sys.stderr)
        return None


def _cmd_info(args: argparse.Namespace) -> int:
    d = _describe_or_report(args.file, "strata model info")
    if d is None:
        return 1
    if args.json:
        print(json.dumps(d, indent=1))
        return 0
    print(
        f"{d['file']}: {d['architecture']} ({d['name'] or 'unnamed'}), vocabulary {d['vocab_size']} "
        f"({d['tokenizer']['model']}/{d['tokenizer']['pre']})"
    )
    if d["blocks"]:
        print(f"  family and blocks: {d['blocks']}")
    else:
        print(f"  strata cannot run it: {d['unsupported']}")
    for k, v in d["dimensions"].items():
        print(f"  {k:34s} {v}")
    types: dict[str, int] = {}
    for t in d["tensors"]:
        types[t["type"]] = types.get(t["type"], 0) + 1
    print("  tensor types: " + ", ".join(f"{n} x {k}" for k, v in sorted(types.items()) for n in [v]))
    print(f"  resident weights (all but routed experts): {_mib(d['resident_bytes'])}")
    eb = d["expert_bytes_per_layer"]
    if eb:
        same = len(set(eb)) == 1
        print(
            "  one expert (gate+up+down): "
            + (
                f"{_mib(eb[0])} in every layer"
                if same
                else ", ".join(f"layer {i}: {_mib(b)}" for i, b in enumerate(eb))
            )
        )
    print("  tensors:")
    for t in d["tensors"]:
        shape = "x".join(map(str, t["shape"]))
        print(f"    {t['name']:32s} {t['type']:8s} {shape:>18s} {t['bytes']:>12d} B")
    return 0


def _cmd_routing(args: argparse.Namespace) -> int:
    from ._routing import lru_hit_rates, route_file, spread
    from ._tokenizer import corpus_texts

    d = _describe_or_report(args.file, "strata model routing")
    if d is None:
        return 1
    from ._presets import FAMILIES

    if d["architecture"] not in FAMILIES or "expert_count" not in d["dimensions"]:
        print(
            f"strata model routing: {args.file} is {d['architecture']}; its NumPy forward pass routes "
            f"{', '.join(FAMILIES)} models",
            file=sys.stderr,
        )
        return 1
    n_expert = int(d["dimensions"]["expert_count"])
    tok = _gguf_tokenizer(args.file)
    text = "\n\n".join(corpus_texts()[:400])
    ids = tok.encode(text).ids[: args.tokens]
    sel = route_file(args.file, ids, args.layers)
    for i, s in enumerate(sel):
        print(f"layer {i:2d}: {spread(s, n_expert)}")
    fr = [0.10, 0.25, 0.50, 0.75]
    rates = lru_hit_rates(sel, n_expert, fr)
    print(
        f"LRU hit rate over {len(ids)} tokens: "
        + ", ".join(f"{f:.0%} cache {r:.1%}" for f, r in rates.items())
    )
    return 0


def _gguf_tokenizer(path: Path):  # type: ignore[no-untyped-def]
    """A ``tokenizers`` tokenizer built from a made model's own vocabulary and merges."""
    from gguf import GGUFReader
    from tokenizers import Tokenizer, decoders, models

    from ._tokenizer import _new_tokenizer

    r = GGUFReader(str(path))
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    merges = [tuple(m.split(" ", 1)) for m in r.fields["tokenizer.ggml.merges"].contents()]
    types = r.fields["tokenizer.ggml.token_type"].contents()
    base = _new_tokenizer()
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = base.pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    # CONTROL tokens are special (never split, skipped when decoding); USER_DEFINED ones are
    # never split but decode as text (<think>, </think>).
    tok.add_special_tokens([t for t, ty in zip(tokens, types, strict=True) if ty == 3])
    tok.add_tokens([t for t, ty in zip(tokens, types, strict=True) if ty == 4])
    return tok
