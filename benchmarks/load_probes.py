"""What the load test measures of the server and the machine while sessions run: the server's
resident memory (`memory_mb`, sampled by `MemorySampler`) and CPU time (`cpu_seconds`), the
machine's busy CPU time (`machine_busy_seconds`), the CPU model for the report, and the
latency statistics of the report (`latency_stats`)."""
from __future__ import annotations

import contextlib
import os
import platform
import statistics
import threading
import time
from pathlib import Path

from benchmarks.harness import busy_cpu_s, proc_memory


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), for the report."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def memory_mb(pid: int) -> dict[str, float]:
    """{"rss": current, "hwm": peak} resident memory of `pid` in MiB (the report's names)."""
    mem = proc_memory(pid)
    return {"rss": mem.get("VmRSS", 0.0), "hwm": mem.get("VmHWM", 0.0)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of `pid` so far (/proc/<pid>/stat; 0 where /proc is missing)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_seconds() -> float:
    """Busy (non-idle) CPU seconds of the whole machine so far, all cores (`harness.busy_cpu_s`;
    0 without /proc/stat)."""
    return busy_cpu_s() or 0.0


class MemorySampler(threading.Thread):
    """Samples `memory_mb(pid)` every `every` s; `.peak_rss` is the highest VmRSS seen, and
    `.timeline` the highest of each `bucket_s` seconds as [seconds since the start, MiB] (when the
    peak came: set it beside the server log's times, from `.started_epoch`). `.step_peaks`: the
    highest while each value of `.step` (set by the caller: what it is doing) was set."""

    def __init__(self, pid: int, every: float = 0.25, bucket_s: float = 5.0):
        super().__init__(daemon=True)
        self.pid, self.every, self.peak_rss, self._stop_event = pid, every, 0.0, threading.Event()
        self.bucket_s, self.timeline, self.started_epoch = bucket_s, [], time.time()
        self.step, self.step_peaks = "start", {}

    def run(self) -> None:
        t0, self.started_epoch = time.monotonic(), time.time()     # the timeline's origin, both clocks
        while not self._stop_event.is_set():
            with contextlib.suppress(OSError, ValueError, ProcessLookupError):
                rss = memory_mb(self.pid)["rss"]
                self.peak_rss = max(self.peak_rss, rss)
                self.step_peaks[self.step] = max(self.step_peaks.get(self.step, 0.0), rss)
                at = (time.monotonic() - t0) // self.bucket_s * self.bucket_s
                if self.timeline and self.timeline[-1][0] == at:
                    self.timeline[-1][1] = max(self.timeline[-1][1], round(rss, 1))
                else:
                    self.timeline.append([at, round(rss, 1)])
            self._stop_event.wait(self.every)

    def stop(self) -> float:
        self._stop_event.set()
        self.join(5)
        return self.peak_rss


def percentile(xs: list[float], q: float) -> float | None:
    """The `q`-th percentile of `xs` (nearest rank), None where `xs` is empty."""
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))]


def latency_stats(xs: list[float]) -> dict[str, float | None]:
    """n, p50, p95, max and mean of `xs` (seconds), rounded to ms; None where `xs` is empty."""
    r = lambda v: None if v is None else round(v, 3)
    return {"n": len(xs), "p50": r(percentile(xs, 50)), "p95": r(percentile(xs, 95)), "max": r(max(xs, default=None)),
            "mean": r(statistics.fmean(xs) if xs else None)}
