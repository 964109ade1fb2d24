"""Where a run happens: the git state of a tree, the CPU, RAM, OS and the GPUs (through strata._nvml).

One collector for the reports that record it: repro_matrix's ``env.json`` and setup section
(repro_matrix/_env.py) and strata_bench's record fields (strata_bench/_records.py). Every function
returns what it could read and leaves out what it could not; none raises.
"""

from __future__ import annotations

import os
import platform
import re
import subprocess
from pathlib import Path
from typing import Any

from . import _nvml

__all__ = ["cpu_info", "git_state", "gpus", "os_info", "ram_info"]

SIMD_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni")


def _git(where: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(where), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_state(where: str | os.PathLike[str]) -> tuple[str | None, bool | None]:
    """(commit, dirty) of the git tree holding ``where`` (tracked files only); (None, None) outside one."""
    commit = _git(Path(where), "rev-parse", "HEAD")
    if not commit:
        return None, None
    status = _git(Path(where), "status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def cpu_info() -> dict[str, Any]:
    """``model``, ``logical_cores`` and, where /proc says, ``simd`` (the kernels' flags present),
    ``physical_cores`` and ``affinity`` (the cores this process may run on)."""
    info: dict[str, Any] = {
        "model": platform.processor() or platform.machine(),
        "logical_cores": os.cpu_count(),
    }
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    if m:
        info["model"] = m.group(1).strip()
    if text:
        fm = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
        flags = set(fm.group(1).split()) if fm else set()
        info["simd"] = " ".join(f for f in SIMD_FLAGS if f in flags)
        cores = set(re.findall(r"physical id\s*:\s*(\d+)[\s\S]*?core id\s*:\s*(\d+)", text))
        if cores:
            info["physical_cores"] = len(cores)
    try:
        info["affinity"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    return info


def ram_info() -> dict[str, int]:
    """``total``, ``available`` and ``swap`` in bytes, from /proc/meminfo (empty where there is none)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return {}
    out = {}
    for key, name in (("MemTotal", "total"), ("MemAvailable", "available"), ("SwapTotal", "swap")):
        m = re.search(rf"^{key}:\s*(\d+) kB", text, re.M)
        if m:
            out[name] = int(m.group(1)) * 1024
    return out


def os_info() -> dict[str, str]:
    """``system``, ``kernel``, ``machine`` and, from /etc/os-release, ``distribution``."""
    out = {"system": platform.system(), "kernel": platform.release(), "machine": platform.machine()}
    try:
        m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', Path("/etc/os-release").read_text(), re.M)
        if m:
            out["distribution"] = m.group(1)
    except OSError:
        pass
    return out


def gpus() -> dict[str, Any]:
    """``{"driver", "cuda_driver", "devices": [{"index", "name", "memory_total"}]}``, or ``{"error": ...}``
    where NVML finds no driver or no device."""
    versions = _nvml.driver_versions()
    if versions is None:
        return {"error": "no NVIDIA driver or GPU"}
    out: dict[str, Any] = {"driver": versions.get("driver"), "devices": []}
    if versions.get("cuda"):
        out["cuda_driver"] = versions["cuda"]
    for g in _nvml.all_gpus():
        out["devices"].append({"index": g["index"], "name": g["name"], "memory_total": g["memory_total"]})
    return out
