"""The machine a benchmark run ran on, for the report: CPU (model name, and vendor / family /
vector extensions: the name alone can be generic under a hypervisor), cores, versions, git
commit, load average, background `vitpe_core train` jobs (which compete for the CPUs; a
stopped one, state `T`, is reported), and the path the fused SaPE² / CoPE attentions take."""
from __future__ import annotations

import contextlib
import datetime as dt
import os
import platform
import re
import shlex
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from benchmarks.harness import background_jobs


def _first(pattern: str, text: str, default: str = "unknown") -> str:
    m = re.search(pattern, text, re.M)
    return m.group(1).strip() if m else default


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def cpu_id(cpuinfo: str) -> str:
    """Vendor, family / model / stepping numbers, vector extensions and hypervisor of the first
    CPU of /proc/cpuinfo (the model name alone can be generic under a hypervisor)."""
    if not cpuinfo:
        return platform.machine() or "unknown"
    field = {k: _first(rf"^{k}\s*:\s*(.*)$", cpuinfo) for k in ("vendor_id", "cpu family", "model", "stepping")}
    flags = _first(r"^flags\s*:\s*(.*)$", cpuinfo, "").split()
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile") if f in flags]
    return (f"{field['vendor_id']}, family {field['cpu family']} model {field['model']} stepping {field['stepping']}"
            + (f"; {' '.join(isa)}" if isa else "") + ("; under a hypervisor" if "hypervisor" in flags else ""))


def environment(argv: list[str], threads: int) -> dict:
    """The run's record of the machine at its start (`loadavg_end` / `background_end` are
    added by the caller at its end)."""
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    chromium = shutil.which("chromium")
    chromium_version = "not found"
    if chromium:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            res = subprocess.run([chromium, "--version"], capture_output=True, text=True, timeout=30)
            chromium_version = _first(r"^(Chromium.*)$", res.stdout, res.stdout.strip() or "unknown")
    from vitpe_core.train import git_commit
    return {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks.bench" + "".join(" " + shlex.quote(a) for a in argv),
        "cpu": _first(r"^model name\s*:\s*(.*)$", cpuinfo, platform.processor() or "unknown"),
        "cpu_id": cpu_id(cpuinfo),
        "cores": os.cpu_count(), "usable_cores": len(os.sched_getaffinity(0)), "torch_threads": threads,
        "platform": platform.platform(), "python": platform.python_version(), "torch": torch.__version__,
        "numpy": np.__version__, "streamlit": _version("streamlit"), "playwright": _version("playwright"),
        "chromium": chromium_version, "git_commit": git_commit(), "loadavg_start": list(os.getloadavg()),
        "background_start": background_jobs(), "cpp_kernel": cpp_kernel_state(),
    }


def cpp_kernel_state() -> str:
    """Which path the fused SaPE² / CoPE attentions take here (vitpe_core/encodings/_kernels.py);
    builds the kernel if it is not cached yet, so no timed section pays for it."""
    from vitpe_core.encodings import _kernels
    if os.environ.get("VITPE_NO_CPP", "") not in ("", "0"):
        return "off (VITPE_NO_CPP): eager PyTorch"
    return "fused C++ kernel" if _kernels.available() else "eager PyTorch (kernel build failed)"


def own_cpu_s() -> float:
    """CPU seconds of this process and its finished children (the memory subprocess)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system
