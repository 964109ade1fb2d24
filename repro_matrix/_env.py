"""The environment a run happened in: strata's version and build, GPU and driver, CPU, RAM, OS, Python.

Collected as a plain dictionary (saved with every run as ``env.json``) and rendered as the report's
"Setup" section; ``repro_matrix env`` prints that section alone.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from strata._environment import cpu_info, git_state, gpus, os_info, ram_info

__all__ = ["collect_env", "env_markdown"]


def _strata() -> dict[str, Any]:
    import strata
    from strata import StrataError

    root = Path(strata.__file__).resolve().parent.parent
    info: dict[str, Any] = {
        "version": strata.__version__,
        "commit": None,
        "dirty": None,
        "library": None,
        "cpu_features": None,
    }
    info["commit"], info["dirty"] = git_state(root)
    # the native library's own idea of its version and of the CPU; a library that cannot be loaded (not
    # built here) is said in the report, with the loader's reason
    from strata import _cdefs, _engine

    try:
        info["library"] = (_cdefs.strata_version() or b"").decode() or None
        info["cpu_features"] = _engine.cpu_features()
        info["cuda_available"] = _engine.cuda_available()
    except (OSError, StrataError) as e:
        info["library_error"] = f"{type(e).__name__}: {e}"
    info["build"] = _build_flags(root)
    return info


def _build_flags(root: Path) -> dict[str, str]:
    """Build settings from the CMake cache of the build that made strata/lib/libstrata.so."""
    flags: dict[str, str] = {}
    for cache in (root / "build" / "native" / "CMakeCache.txt",):
        if not cache.is_file():
            continue
        wanted = (
            "CMAKE_BUILD_TYPE",
            "CMAKE_C_COMPILER",
            "CMAKE_C_FLAGS",
            "CMAKE_C_FLAGS_RELEASE",
            "CMAKE_CUDA_COMPILER",
            "CMAKE_CUDA_ARCHITECTURES",
            "STRATA_CUDA",
            "STRATA_SANITIZE",
            "STRATA_NATIVE_ARCH",
        )
        for line in cache.read_text(errors="replace").splitlines():
            m = re.match(r"([A-Z_]+):[A-Z]+=(.*)", line)
            if m and m.group(1) in wanted and m.group(2):
                flags[m.group(1)] = m.group(2)
    cc = flags.get("CMAKE_C_COMPILER")
    if cc:
        try:
            out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10).stdout
            flags["compiler"] = out.splitlines()[0] if out else cc
        except (OSError, subprocess.SubprocessError):
            pass
    if os.environ.get("STRATA_LIB"):
        flags["STRATA_LIB"] = os.environ["STRATA_LIB"]
    return flags


def _packages() -> dict[str, str]:
    out = {}
    for name in ("numpy", "gguf", "tokenizers", "pandas", "httpx", "uvicorn", "starlette", "ray"):
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def collect_env() -> dict[str, Any]:
    """Everything the report's setup section says, as a JSON-ready dictionary."""
    return {
        "strata": _strata(),
        "gpu": gpus(),
        "cpu": cpu_info(),
        "ram": ram_info(),
        "os": os_info(),
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
            "packages": _packages(),
        },
    }


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / (1 << 30):.1f} GiB"


def env_markdown(env: dict[str, Any]) -> str:
    """The setup section: one bullet per part, in the words a maintainer expects."""
    st = env.get("strata", {})
    lines = []
    commit = st.get("commit")
    v = f"strata {st.get('version', '?')}"
    if commit:
        v += f", commit {commit[:12]}" + (" (with uncommitted changes)" if st.get("dirty") else "")
    if st.get("library"):
        v += f", libstrata {st['library']}"
    elif st.get("library_error"):
        v += f"; libstrata not loaded ({st['library_error'].splitlines()[0]})"
    lines.append(f"- **strata**: {v}")
    build = st.get("build") or {}
    if build:
        parts = [f"{k}={val}" for k, val in build.items()]
        lines.append(f"- **Build**: {'; '.join(parts)}")
    else:
        lines.append("- **Build**: no CMake cache found (an installed wheel, or built elsewhere)")
    if st.get("cpu_features"):
        lines.append(f"- **Kernels**: CPU features {st['cpu_features']}")
    gpu = env.get("gpu", {})
    if gpu.get("devices"):
        devs = "; ".join(f"{d['name']} ({_gib(d['memory_total'])})" for d in gpu["devices"])
        cuda = f", CUDA {gpu['cuda_driver']}" if gpu.get("cuda_driver") else ""
        lines.append(f"- **GPU**: {devs}; driver {gpu.get('driver', '?')}{cuda}")
    else:
        lines.append(f"- **GPU**: none ({gpu.get('error', 'no devices')})")
    cpu = env.get("cpu", {})
    cores = f"{cpu.get('logical_cores')} logical cores"
    if cpu.get("physical_cores"):
        cores = f"{cpu['physical_cores']} physical / " + cores
    if cpu.get("affinity") and cpu.get("affinity") != cpu.get("logical_cores"):
        cores += f", {cpu['affinity']} usable"
    simd = f"; {cpu['simd']}" if cpu.get("simd") else ""
    lines.append(f"- **CPU**: {cpu.get('model', '?')}, {cores}{simd}")
    ram = env.get("ram", {})
    lines.append(
        f"- **RAM**: {_gib(ram.get('total'))} total, {_gib(ram.get('available'))} available"
        + (f", swap {_gib(ram.get('swap'))}" if ram.get("swap") is not None else "")
    )
    o = env.get("os", {})
    lines.append(
        f"- **OS**: {o.get('distribution', o.get('system', '?'))}, kernel {o.get('kernel', '?')} "
        f"({o.get('machine', '?')})"
    )
    py = env.get("python", {})
    pk = ", ".join(f"{k} {val}" for k, val in (py.get("packages") or {}).items())
    lines.append(
        f"- **Python**: {py.get('implementation', '')} {py.get('version', '?')}" + (f" ({pk})" if pk else "")
    )
    return "\n".join(lines) + "\n"
