"""Who the load test's sessions are and when they act: one share link each (`Spec`,
`make_specs`: checkpoints and images in turn, distinct starting patches), and the gates that
start the sessions' clicking together once all have loaded (`Gate`) and hold the click-only
phase that measures the server's CPU per click (`PhaseGate`)."""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from benchmarks.load_probes import cpu_seconds


@dataclass
class Spec:
    """One session's share link (checkpoint, image, starting patch), the checkpoint's patch grid
    and the seed of the session's random choices."""

    ckpt: str
    image: str
    patch: tuple[int, int]
    grid: tuple[int, int]
    seed: int


def make_specs(n: int, grids: dict[str, tuple[int, int]], images: list[str]) -> list[Spec]:
    """`n` different share links: checkpoints and images in turn, distinct starting patches."""
    names = sorted(grids)
    specs = []
    for i in range(n):
        name = names[i % len(names)]
        H, W = grids[name]
        specs.append(Spec(ckpt=name, image=images[(3 * i) % len(images)], patch=((i * 3) % H, (i * 5 + 1) % W),
                          grid=(H, W), seed=i))
    return specs


class Gate:
    """Clicking starts for all sessions at once, when every one has loaded (or failed to)."""

    def __init__(self, n: int, seconds: float, server_pid: int):
        self.n, self.seconds, self.pid, self.arrived, self.deadline = n, seconds, server_pid, 0, float("inf")
        self.open = asyncio.Event()
        self.opened_at, self.server_cpu_at_open = 0.0, 0.0

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.n:
            self.opened_at, self.server_cpu_at_open = time.monotonic(), cpu_seconds(self.pid)
            self.deadline = self.opened_at + self.seconds
            self.open.set()
        await self.open.wait()


class PhaseGate(Gate):
    """`Gate` plus the click-only phase: it opens when every session still running arrived
    (or after `wait` s) and lasts `phase` s; the server's CPU time is read at both ends."""

    def __init__(self, n: int, seconds: float, server_pid: int, phase: float, wait: float = 120.0):
        super().__init__(n, seconds, server_pid)
        self.phase, self.wait, self.active = phase, wait, n
        self.phase_arrived, self.phase_left = 0, 0
        self.phase_open = asyncio.Event()
        self.phase_deadline = float("inf")
        self.phase_cpu = [0.0, 0.0]
        self.phase_time = [0.0, 0.0]
        self.owners: dict[str, int] = {}        # upload:<sha256> -> the session that uploaded it

    def _open_phase(self) -> None:
        if not self.phase_open.is_set():
            self.phase_time[0], self.phase_cpu[0] = time.monotonic(), cpu_seconds(self.pid)
            self.phase_deadline = self.phase_time[0] + self.phase
            self.phase_open.set()

    def leave_early(self) -> None:
        """A session that will not reach the phase (it failed, or is a browser session)."""
        self.active -= 1
        if self.phase_arrived and self.phase_arrived >= self.active:
            self._open_phase()

    async def arrive_phase(self) -> None:
        self.phase_arrived += 1
        if self.phase_arrived >= self.active:
            self._open_phase()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.phase_open.wait(), self.wait)
        self._open_phase()

    async def leave_phase(self) -> None:
        self.phase_left += 1
        self.phase_time[1], self.phase_cpu[1] = time.monotonic(), cpu_seconds(self.pid)
