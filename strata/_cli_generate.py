"""``strata generate``: run a prompt through the engine and print what it generates.

Tokens are printed as they come, then the prompt and decode speeds. ``--json`` prints one object
instead (prompt ids, generated ids, the top-5 logits of each step, timings), so that scripts and other
engines can be compared with it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ._config import add_engine_args, config_or_usage_error
from ._failure import UserError
from ._model_path import model_path_problem
from .tokenizer import Tokenizer

__all__ = ["add_parser", "parse_ids", "run"]

_TOP_N = 5


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "generate",
        help="generate text from a prompt",
        description="Run a prompt through the engine and print the generated tokens.",
    )
    p.add_argument("--model", help="GGUF model file (default: the tiny synthetic model)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (needs the model's tokenizer)")
    src.add_argument("--prompt-ids", type=parse_ids, help="prompt as token ids: 1,2,3")
    p.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling threshold (1 = off)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the best (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    add_engine_args(p)
    p.set_defaults(func=run)
    return p


def parse_ids(text: str) -> list[int]:
    """``1,2,3`` -> [1, 2, 3]."""
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--prompt-ids: {text!r} is not a comma-separated list of integers"
        ) from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids: no token ids given")
    return ids


def _model_path(args: argparse.Namespace) -> Path:
    """The model file to run: ``--model`` (checked before anything opens it) or the tiny default."""
    if not args.model:
        from .model import default_model

        return Path(default_model())
    problem = model_path_problem(args.model)
    if problem is not None:
        raise UserError(problem)
    return Path(args.model)


def run(args: argparse.Namespace) -> int:
    """Failures raise (StrataError, UserError, a refused file): ``strata.cli`` prints them in one paragraph."""
    from ._engine import Engine

    config = config_or_usage_error(args, "strata generate")
    if config is None:
        return 2
    model_path = _model_path(args)
    tok = None
    if args.prompt is not None:
        tok = Tokenizer.from_gguf(model_path)
        prompt_ids = list(tok.encode(args.prompt))
    else:
        prompt_ids = list(args.prompt_ids)
    with Engine(model_path, config) as eng:
        streamed: list[int] = []
        printed = [""]

        def on_token(token: int, _logits: Any) -> bool:
            streamed.append(token)
            if args.json:
                return False
            if tok is not None:
                text = tok.decode(streamed)
                if text.endswith("\ufffd"):
                    return False  # a character split across tokens: wait for its other bytes
                sys.stdout.write(text[len(printed[0]) :])
                printed[0] = text
            else:
                sys.stdout.write(f"{token} ")
            sys.stdout.flush()
            return False

        res = eng.generate(
            prompt_ids,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            seed=args.seed,
            on_token=on_token,
            top_logits=_TOP_N if args.json else 0,
        )
        timings = {
            "prompt_n": res.prompt_tokens,
            "prompt_ms": res.prompt_ms,
            "prompt_per_second": res.prompt_tokens / (res.prompt_ms / 1e3) if res.prompt_ms > 0 else 0.0,
            "predicted_n": len(res.tokens),
            "predicted_ms": res.decode_ms,
            # the first generated token comes from the prompt's logits: decode steps = n - 1
            "predicted_per_second": (max(0, len(res.tokens) - 1)) / (res.decode_ms / 1e3)
            if res.decode_ms > 0
            else 0.0,
        }
        if args.json:
            out = {
                "model": str(model_path),
                "prompt_ids": prompt_ids,
                "generated_ids": res.tokens,
                "finish_reason": res.finish_reason,
                "top": [[[i, v] for i, v in step] for step in res.top],
                "timings": timings,
                "config": config.to_dict(),
            }
            print(json.dumps(out))
        else:
            if tok is not None:
                sys.stdout.write(tok.decode(streamed)[len(printed[0]) :])
            sys.stdout.write("\n")
            sys.stdout.flush()  # the text first, then the speeds on stderr
            print(
                f"prompt: {timings['prompt_n']} tokens in {timings['prompt_ms']:.1f} ms "
                f"({timings['prompt_per_second']:.1f} tokens/s); decode: {timings['predicted_n']} tokens in "
                f"{timings['predicted_ms']:.1f} ms ({timings['predicted_per_second']:.1f} tokens/s); "
                f"finish: {res.finish_reason}",
                file=sys.stderr,
            )
    return 0
