"""``strata generate`` as a user runs it (a subprocess), and the library loader's error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from strata import LibraryNotFoundError
from strata._engine import Engine
from strata._lib import candidate_paths, load_from
from strata.tokenizer import Tokenizer

PROMPT = [1, 50, 60, 70, 80]


def strata(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_json_output_matches_the_engine(tiny: Path) -> None:
    ids = ",".join(map(str, PROMPT))
    r = strata(
        "generate", "--model", str(tiny), "--prompt-ids", ids, "--max-tokens", "6", "--json", "--threads", "2"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    with Engine(tiny) as eng:
        want = eng.generate(PROMPT, max_tokens=6, top_logits=5)
    assert out["prompt_ids"] == PROMPT
    assert out["generated_ids"] == want.tokens
    assert len(out["top"]) == len(want.tokens)
    for step, tok, ref in zip(out["top"], want.tokens, want.top, strict=True):
        assert step[0][0] == tok and [i for i, _ in step] == [i for i, _ in ref]
        assert all(step[i][1] >= step[i + 1][1] for i in range(len(step) - 1))
    t = out["timings"]
    assert t["prompt_n"] == len(PROMPT) and t["predicted_n"] == len(want.tokens)
    assert t["prompt_ms"] > 0 and t["prompt_per_second"] > 0
    assert out["config"]["threads"] == 2


def test_text_output_streams_ids_and_reports_speed(tiny: Path) -> None:
    r = strata(
        "generate", "--model", str(tiny), "--prompt-ids", "1,2,3", "--max-tokens", "4", "--temperature", "0.8"
    )
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.split()) <= 4 and all(s.isdigit() for s in r.stdout.split())
    assert "tokens/s" in r.stderr and "prompt:" in r.stderr and "decode:" in r.stderr


def test_text_prompt_goes_through_the_models_tokenizer(tiny: Path, tiny_tok: Tokenizer) -> None:
    tok = tiny_tok
    ids = tok.encode("The quick brown fox")
    r = strata(
        "generate", "--model", str(tiny), "--prompt", "The quick brown fox", "--max-tokens", "5", "--json"
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["prompt_ids"] == ids
    r2 = strata("generate", "--model", str(tiny), "--prompt", "The quick brown fox", "--max-tokens", "5")
    assert r2.returncode == 0, r2.stderr
    assert r2.stdout.rstrip("\n") == tok.decode(out["generated_ids"])


def test_bad_inputs_give_messages(tiny: Path, tmp_path: Path) -> None:
    r = strata("generate", "--model", str(tmp_path / "none.gguf"), "--prompt-ids", "1")
    assert r.returncode == 1 and "none.gguf" in r.stderr
    r = strata("generate", "--model", str(tiny), "--prompt-ids", "1,x")
    assert r.returncode == 2 and "--prompt-ids" in r.stderr
    r = strata("generate", "--model", str(tiny), "--prompt-ids", "999999")
    assert r.returncode == 1 and "vocabulary" in r.stderr
    r = strata("generate", "--model", str(tiny), "--prompt-ids", "1", "--top-p", "0")
    assert r.returncode == 1 and "top_p" in r.stderr


def test_loader_names_every_path_it_tried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing, junk = tmp_path / "missing.so", tmp_path / "junk.so"
    junk.write_bytes(b"not a shared library")
    with pytest.raises(LibraryNotFoundError) as ei:
        load_from([missing, junk])
    msg = str(ei.value)
    assert f"{missing} (no such file)" in msg and str(junk) in msg and "make native" in msg
    monkeypatch.setenv("STRATA_LIB", str(missing))
    # STRATA_LIB is the one candidate: a named library that does not load is an error, not a fallback
    assert candidate_paths() == [missing]
    with pytest.raises(LibraryNotFoundError, match="STRATA_LIB names the library"):
        load_from(candidate_paths())
