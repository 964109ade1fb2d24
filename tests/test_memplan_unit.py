"""Unit checks of the arena, the plan and the expert cache in C, without a model.

``tests/native/test_memplan.c`` is compiled together with the engine's plan.c, arena.c, cache.c and
error.c (with AddressSanitizer and UBSan where the compiler has them) and run; it prints its figures
(the legacy-failure ranges of the tiny preset and of Qwen3-30B-A3B's dimensions) and fails on any check.
"""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "native" / "src"


def _compile(tmp_path: pathlib.Path, sanitize: bool) -> pathlib.Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc:
        pytest.fail("no C compiler (cc or gcc) on PATH: the engine needs one to build", pytrace=False)
    exe = tmp_path / "test_memplan"
    flags = ["-std=c11", "-D_GNU_SOURCE", "-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter", "-O1", "-g"]
    if sanitize:
        flags += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
    srcs = [ROOT / "tests" / "native" / "test_memplan.c"] + [
        SRC / f for f in ("plan.c", "arena.c", "cache.c", "error.c")
    ]
    cmd = [cc, *flags, f"-I{ROOT / 'native' / 'include'}", f"-I{SRC}", *map(str, srcs), "-lm", "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 and sanitize:
        return _compile(tmp_path, sanitize=False)  # a compiler without the sanitizer runtimes
    assert r.returncode == 0, r.stderr
    return exe


def test_memplan_unit_checks(tmp_path: pathlib.Path) -> None:
    exe = _compile(tmp_path, sanitize=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all checks passed" in r.stdout
    # the legacy bug exists on both the tiny preset's and the real model's dimensions
    assert (
        "tiny (context 4096): legacy fails" in r.stdout
        and "qwen3-30b-a3b (context 32768): legacy fails" in r.stdout
    )
