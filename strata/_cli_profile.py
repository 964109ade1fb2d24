"""``strata profile save``: run a workload and save what the expert cache learned.

    strata profile save --model FILE --out PROFILE [engine flags] [--prompt-ids 1,2,3 | --tokens N]

The engine reads the prompt (the given ids, or N token ids drawn with --seed), generates --max-tokens
tokens greedily while the cache learns which experts are routed to, and writes the ranked
(layer, expert) profile. ``--expert-profile PROFILE`` fills the cache from it at the next start.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ._cli_generate import parse_ids
from ._config import add_engine_args, config_or_usage_error
from ._exceptions import StrataError

__all__ = ["add_parser", "run_save"]


def add_parser(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "profile",
        help="save the expert profile a workload teaches the cache",
        description="Expert-cache profiles: ranked (layer, expert) lists for --expert-profile.",
    )
    psub = p.add_subparsers(dest="profile_command", metavar="ACTION")
    s = psub.add_parser(
        "save",
        help="run a workload and write the profile the cache learned",
        description="Run a prompt and a greedy generation, then write the ranked profile.",
    )
    s.add_argument("--model", help="GGUF model file (default: the tiny synthetic model)")
    s.add_argument("--out", required=True, help="profile file to write")
    src = s.add_mutually_exclusive_group()
    src.add_argument("--prompt-ids", type=parse_ids, help="prompt as token ids: 1,2,3")
    src.add_argument("--tokens", type=int, default=256, help="a prompt of N random token ids (default 256)")
    s.add_argument(
        "--max-tokens", type=int, default=256, help="tokens to generate while learning (default 256)"
    )
    s.add_argument("--seed", type=int, default=0, help="seed of the random prompt")
    add_engine_args(s)
    s.set_defaults(func=run_save)
    p.set_defaults(func=lambda _a: (p.print_help(), 2)[1])
    return p


def run_save(args: argparse.Namespace) -> int:
    from ._engine import Engine

    cfg = config_or_usage_error(args, "strata profile save")
    if cfg is None:
        return 2
    if args.max_tokens < 0 or (args.prompt_ids is None and args.tokens < 1):
        print(
            "strata profile save: --tokens must be at least 1 and --max-tokens not negative", file=sys.stderr
        )
        return 2
    if args.model:
        model = Path(args.model)
    else:
        from .model import ensure_model

        model = Path(ensure_model("tiny"))
    try:
        with Engine(model, cfg) as eng:
            if args.prompt_ids is not None:
                prompt = list(args.prompt_ids)
            else:
                n = min(args.tokens, eng.plan.max_context - args.max_tokens)
                if n < 1:
                    raise StrataError(
                        f"--max-tokens {args.max_tokens} leaves no room for a prompt in the context"
                    )
                rng = np.random.default_rng(args.seed)
                prompt = rng.integers(0, eng.info.n_vocab, n).tolist()
            r = eng.generate(prompt, max_tokens=args.max_tokens, stop_at_eos=False)
            eng.save_profile(args.out)
            st = eng.stats()
            rate = st.hits / st.lookups if st.lookups else 0.0
            print(
                f"wrote {args.out}: {eng.info.n_layer * eng.info.n_expert} experts ranked after "
                f"{len(prompt)} prompt and {len(r.tokens)} generated tokens "
                f"(cache {eng.plan.n_slots} slots, hit rate {rate:.1%}, {st.swaps} swaps)"
            )
    except (StrataError, OSError) as e:
        print(f"strata profile save: {e}", file=sys.stderr)
        return 1
    return 0
