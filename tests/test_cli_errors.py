"""What a user sees when a command fails: one paragraph that says what to do, never a traceback
(``--debug`` or ``STRATA_DEBUG=1`` adds it), and paths the engine must refuse before opening them."""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from strata import InvalidArgumentError, ModelFileError
from strata._engine import Engine
from strata.cli import build_parser


def strata(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "strata.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "STRATA_DEBUG": "", **(env or {})},
        stdin=subprocess.DEVNULL,
    )


def one_paragraph(r: subprocess.CompletedProcess[str], prog: str) -> str:
    assert r.returncode != 0
    assert "Traceback" not in r.stderr, r.stderr
    err = r.stderr.strip()
    assert err.startswith(f"{prog}: ") and "\n" not in err, err
    return err


def test_generate_with_a_missing_model(tmp_path: Path) -> None:
    err = one_paragraph(
        strata("generate", "--prompt", "hi", "--model", str(tmp_path / "no.gguf")), "strata generate"
    )
    assert "not found" in err and "--model" in err


def test_generate_with_a_file_that_is_not_a_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a model at all" * 10)
    err = one_paragraph(strata("generate", "--prompt", "hi", "--model", str(bad)), "strata generate")
    assert "not a GGUF file" in err
    err = one_paragraph(strata("generate", "--prompt-ids", "1,2", "--model", str(bad)), "strata generate")
    assert str(bad) in err


def test_debug_shows_the_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"x" * 64)
    for r in (
        strata("generate", "--prompt", "hi", "--model", str(bad), "--debug"),
        strata("--debug", "generate", "--prompt", "hi", "--model", str(bad)),
        strata("generate", "--prompt", "hi", "--model", str(bad), env={"STRATA_DEBUG": "1"}),
    ):
        assert r.returncode == 1
        assert "Traceback" in r.stderr and "not a GGUF file" in r.stderr.splitlines()[-1]


def test_a_fifo_as_model_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    # before the fix the open blocked until something wrote to the pipe: the timeout fails the test
    err = one_paragraph(
        strata("generate", "--prompt-ids", "1", "--model", str(fifo), timeout=60), "strata generate"
    )
    assert "pipe" in err
    with pytest.raises(ModelFileError, match="pipe"):
        Engine(fifo)


def test_a_nul_in_the_model_path_is_refused(tiny: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="NUL"):
        Engine(str(tiny) + "\x00x")  # the C side would have opened tiny.gguf
    with pytest.raises(ModelFileError, match="folder"):
        Engine(tiny.parent)


def test_chat_with_a_corrupted_or_foreign_database(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.sqlite3"
    corrupt.write_bytes(bytes(range(256)) * 40)
    foreign = tmp_path / "foreign.sqlite3"
    with sqlite3.connect(foreign) as db:
        db.execute("CREATE TABLE notes (body TEXT)")
    clash = tmp_path / "clash.sqlite3"
    with sqlite3.connect(clash) as db:
        db.execute("CREATE TABLE messages (x TEXT)")
    for path, words in ((corrupt, "damaged"), (foreign, "not a strata chat database"), (clash, "damaged")):
        # the port is closed: the database is opened (and refused) before any connection is tried
        err = one_paragraph(
            strata("chat", "--server", "http://127.0.0.1:9", "--db", str(path)), "strata chat"
        )
        assert words in err and "--db" in err
    with sqlite3.connect(foreign) as db:  # nothing was added to the other program's database
        assert [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")] == ["notes"]


def test_chat_comes_from_the_tui_package_entry_point() -> None:
    p = build_parser()
    sub = next(a for a in p._actions if a.__class__.__name__ == "_SubParsersAction")
    assert list(sub.choices)[:4] == ["generate", "model", "serve", "profile"]
    assert sub.choices["chat"].get_default("func").__module__ == "strata_tui.cli"
    core = Path(__file__).parent.parent / "strata"
    by_name = re.compile(r"(?:import|from)\s+strata_tui|[\"']strata_tui")
    for f in core.rglob("*.py"):  # the core imports no package above it, by statement or by name
        assert not by_name.search(f.read_text(encoding="utf-8")), f


@pytest.mark.parametrize("command", ["chat", "serve", "generate"])
@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--threads", "-3"], "--threads: -3 is out of range (0 = all cores, up to 1024)"),
        (["--lend-pct", "3"], "--lend-pct: 3.0 is not in (0, 1]"),
    ],
)
def test_a_flag_out_of_range_is_refused_before_anything_starts(
    command: str, flags: list[str], words: str, tmp_path: Path
) -> None:
    """Each command that opens an engine refuses a flag out of range with one line and exit status 2, before
    a server, an engine or the chat's screen starts (the chat used to open and then show its server's exit)."""
    extra = ["--prompt", "hi"] if command == "generate" else []
    r = strata(command, *extra, *flags, env={"STRATA_CACHE_DIR": str(tmp_path)}, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert one_paragraph(r, f"strata {command}") == f"strata {command}: {words}"
