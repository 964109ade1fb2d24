"""The CUDA architectures the build chooses (native/CMakeLists.txt), by configuring it with the local nvcc:
every card from sm_75 on plus compute_75 PTX by default; CMAKE_CUDA_ARCHITECTURES kept once given; an
architecture the nvcc cannot build left out of the default with a message; one below Turing refused.
Configuring only (a few seconds each): CI's build itself compiles every architecture."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NVCC = shutil.which("nvcc")
CMAKE = shutil.which("cmake")

pytestmark = pytest.mark.skipif(not (NVCC and CMAKE), reason="needs nvcc and cmake")

ALL = "75-real 80-real 86-real 89-real 90-real 120-real 75-virtual"


def _configure(build: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CUDAARCHS"}
    return subprocess.run(
        [CMAKE, "-S", str(ROOT / "native"), "-B", str(build), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def _archs(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stdout.splitlines() if "strata: CUDA backend enabled for" in x]
    assert lines, f"no architectures reported:\n{proc.stdout[-2000:]}"
    return lines[-1].split("enabled for ", 1)[1].strip()


def test_default_is_every_card_a_given_list_is_kept_and_old_cards_refused(tmp_path):
    build = tmp_path / "b"
    got = _archs(_configure(build))
    listed = subprocess.run([NVCC, "--list-gpu-code"], capture_output=True, text=True).stdout.split()
    if "sm_120" in listed:
        assert got == ALL
    else:
        assert got == ALL.replace("120-real ", "")
    assert _archs(_configure(build)) == got, "a second configure changed the default architectures"
    assert _archs(_configure(build, "-DCMAKE_CUDA_ARCHITECTURES=86")) == "86"
    assert _archs(_configure(build)) == "86", "CMAKE_CUDA_ARCHITECTURES was forgotten on the next configure"
    assert _archs(_configure(build, "-DSTRATA_CUDA_ARCHS=90-real;75-virtual")) == "90-real 75-virtual"
    # below Turing: refused with the reason (the kernels use sm_75's mma and ldmatrix)
    proc = _configure(build, "-DSTRATA_CUDA_ARCHS=70")
    assert proc.returncode != 0
    assert "need sm_75 (Turing) or newer" in proc.stderr.replace("\n  ", " ")


def test_an_nvcc_without_sm_120_leaves_it_out(tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "--list-gpu-code" ]; then "{NVCC}" --list-gpu-code | grep -v sm_12; exit 0; fi\n'
        f'if [ "$1" = "--list-gpu-arch" ]; then "{NVCC}" --list-gpu-arch | grep -v compute_12; exit 0; fi\n'
        f'exec "{NVCC}" "$@"\n'
    )
    fake.chmod(0o755)
    proc = _configure(tmp_path / "b", f"-DCMAKE_CUDA_COMPILER={fake}")
    assert _archs(proc) == ALL.replace("120-real ", "")
    assert "cannot build 120-real: left out" in proc.stdout
