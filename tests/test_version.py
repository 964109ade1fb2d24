"""The version is written once (strata/_version.py): the package, the native library and the build
metadata all read it."""

from __future__ import annotations

import re
from pathlib import Path

import strata
from strata import _cdefs, _version

ROOT = Path(__file__).resolve().parents[1]


def test_the_library_reports_the_packages_version() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", _version.__version__)
    assert strata.__version__ == _version.__version__
    assert (_cdefs.strata_version() or b"").decode() == _version.__version__


def test_pyproject_reads_the_version_from_the_one_file() -> None:
    text = (ROOT / "pyproject.toml").read_text()  # (tomllib is 3.11+; the package supports 3.10)
    project = text.split("[project]", 1)[1].split("\n[", 1)[0]
    assert not re.search(r"^version\s*=", project, re.M)
    assert re.search(r'^dynamic = \["version"\]', project, re.M)
    assert 'metadata.version.provider = "scikit_build_core.metadata.regex"' in text
    assert 'metadata.version.input = "strata/_version.py"' in text


def test_no_other_file_writes_the_version() -> None:
    v = re.escape(_version.__version__)
    places = [ROOT / "pyproject.toml", ROOT / "strata" / "__init__.py", ROOT / "native" / "src" / "version.c",
              ROOT / "native" / "CMakeLists.txt"]  # fmt: skip
    for p in places:
        assert not re.search(rf"[\"']{v}[\"']", p.read_text()), f"{p} writes the version itself"
