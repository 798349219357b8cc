"""Pick (and keep re-picking) the number of torch threads that fits a shared CPU.

OpenMP threads that outnumber the free cores wreck CPU training (a 2-thread step can be
8-10x slower while another process holds one of 2 cores, where 1 thread is only ~2x slower).
`ThreadGovernor` measures how many cores OTHER processes use (busy time from /proc/stat minus
this process's own CPU time) and sets torch to the cores that are left, at least 1.
"""

from __future__ import annotations

import os
import time

import torch


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _busy_jiffies() -> float | None:
    """Busy CPU time of the whole machine in seconds (None where /proc/stat is unreadable)."""
    try:
        with open("/proc/stat") as f:
            parts = f.readline().split()
    except OSError:
        return None
    vals = [int(v) for v in parts[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)  # idle + iowait
    busy = sum(vals[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def initial_threads(cores: int) -> int:
    """Cores minus what the 1-minute load average says others use (this process has not run yet)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = 0.0
    return max(1, min(cores, int(cores - load + 0.35)))


class ThreadGovernor:
    """`--threads auto`: re-evaluate every `period` seconds; `--threads N`: fixed N."""

    def __init__(self, spec: str | int, period: float = 10.0, log=print):
        self.cores = available_cores()
        self.auto = str(spec) == "auto"
        self.period = period
        self.log = log
        self._quiet = 0
        n = initial_threads(self.cores) if self.auto else max(1, int(spec))
        self._set(n, "start")
        self._mark = (time.monotonic(), _busy_jiffies(), _own_cpu())

    def _set(self, n: int, why: str) -> None:
        self.threads = n
        torch.set_num_threads(n)
        self.log(f"[threads] {n} torch thread(s) ({why}; {self.cores} core(s) available)")

    def others(self) -> float | None:
        """Cores used by other processes since the last check."""
        now, busy, own = time.monotonic(), _busy_jiffies(), _own_cpu()
        t0, b0, o0 = self._mark
        self._mark = (now, busy, own)
        if busy is None or b0 is None or now - t0 <= 0:
            return None
        return max(0.0, ((busy - b0) - (own - o0)) / (now - t0))

    def maybe_update(self) -> None:
        if not self.auto or time.monotonic() - self._mark[0] < self.period:
            return
        others = self.others()
        if others is None:
            return
        # fewer threads as soon as others take a noticeable share (an oversubscribed step can
        # be 10x slower); more again only after two quiet checks in a row
        n = max(1, min(self.cores, int(self.cores - others + 0.7)))
        if n > self.threads:
            self._quiet += 1
            if self._quiet < 2:
                return
        self._quiet = 0
        if n != self.threads:
            self._set(n, f"other processes use {others:.2f} core(s)")
