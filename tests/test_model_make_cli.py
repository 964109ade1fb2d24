"""``strata model make`` as a user runs it: it shows the tensors and bytes it has written, and a stop
(SIGTERM, SIGINT) or an error leaves no partial file behind."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest


def make(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "strata.cli", "model", "make", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "STRATA_DEBUG": ""},
    )


def test_progress_is_shown_on_stderr(tmp_path: Path) -> None:
    out = tmp_path / "tiny.gguf"
    with make("--preset", "tiny", "--out", str(out)) as p:
        stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 0, stderr
    lines = [ln for ln in stderr.splitlines() if ln.startswith("writing: ")]
    assert lines[0].startswith("writing: 0/") and re.match(r"writing: (\d+)/\1 tensors.*\(100%", lines[-1]), (
        lines
    )
    assert len(lines) >= 3  # steps in between, not only the start and the end
    assert stdout.strip() == str(out)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_while_writing_leaves_no_part_file(tmp_path: Path, sig: signal.Signals) -> None:
    out = tmp_path / "big.gguf"
    # the 30B preset writes 16+ GB: it is stopped as soon as its tensors start, long before the end
    with make("--preset", "qwen3-30b-a3b", "--out", str(out)) as p:
        assert p.stderr is not None
        # a maker that shows no progress would write all 30 GiB before stderr ends: stop it first
        guard = threading.Timer(90, p.kill)
        guard.start()
        try:
            for line in p.stderr:
                if line.startswith("writing: "):
                    break
            else:
                raise AssertionError("no progress line")
            assert any(f.name.endswith(".part") for f in tmp_path.iterdir())  # being written
            p.send_signal(sig)
            p.communicate(timeout=120)
        finally:
            guard.cancel()
            if p.poll() is None:
                p.kill()
                p.communicate()
    left = list(tmp_path.iterdir())
    assert (p.returncode, left) == (130 if sig == signal.SIGINT else 128 + sig, [])
