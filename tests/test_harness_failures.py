"""``repro_matrix`` and ``strata-bench`` end a failure as the ``strata`` command does (``strata._failure``):
one paragraph that says what to do, never a traceback; ``--debug`` or ``STRATA_DEBUG=1`` adds it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import repro_matrix.cli as matrix_cli
import strata_bench.cli as bench_cli


def _boom(_args: Any) -> int:
    raise RuntimeError("the cell table lost a row")


@pytest.mark.parametrize(
    "module,prog,argv,command",
    [
        (matrix_cli, "repro_matrix", ["env"], "cmd_env"),
        (bench_cli, "strata-bench", ["show", "x.jsonl"], "cmd_show"),
    ],
)
def test_an_unexpected_failure_is_one_paragraph_and_debug_shows_where(
    module: Any,
    prog: str,
    argv: list[str],
    command: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(module, command, _boom)
    monkeypatch.delenv("STRATA_DEBUG", raising=False)
    rc = module.main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == (2 if module is matrix_cli else 1)  # repro_matrix: 1 means "a cell failed"
    assert "Traceback" not in err and "\n" not in err, err
    assert err.startswith(f"{prog} {argv[0]}: unexpected error (RuntimeError: the cell table lost a row)")
    assert "--debug" in err and "STRATA_DEBUG=1" in err
    for debug_argv, env in ((argv[:1] + ["--debug"] + argv[1:], None), (argv, "1")):
        if env:
            monkeypatch.setenv("STRATA_DEBUG", env)
        assert module.main(debug_argv) != 0
        err = capsys.readouterr().err
        assert "Traceback" in err and "_boom" in err and err.strip().endswith("report it with that output")


def test_a_harness_error_keeps_its_own_words(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from repro_matrix._matrix import MatrixError
    from strata_bench._llamacpp import LlamaBenchError

    def matrix_error(_args: Any) -> int:
        raise MatrixError("axis 'expert_cache' is empty: give it at least one value")

    def bench_error(_args: Any) -> int:
        raise LlamaBenchError("llama-bench was not found: give --llama-bench PATH")

    monkeypatch.setattr(matrix_cli, "cmd_env", matrix_error)
    monkeypatch.setattr(bench_cli, "cmd_show", bench_error)
    assert matrix_cli.main(["env"]) == 2
    assert capsys.readouterr().err.strip() == (
        "repro_matrix env: axis 'expert_cache' is empty: give it at least one value"
    )
    assert bench_cli.main(["show", "x.jsonl"]) == 1
    assert (
        capsys.readouterr().err.strip()
        == "strata-bench show: llama-bench was not found: give --llama-bench PATH"
    )


def test_strata_bench_show_on_a_folder_says_so(tmp_path: Path) -> None:
    # an OSError other than a missing file went out as a traceback
    r = subprocess.run(
        [sys.executable, "-m", "strata_bench.cli", "show", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "STRATA_DEBUG": ""},
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip() == f"strata-bench show: Is a directory: {tmp_path}"
