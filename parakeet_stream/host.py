"""Facts and policy of the machine the process runs on: cores, free memory, host threads."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import torch


def single_threaded_host() -> None:
    """Call first thing in a program that runs an ASREngine (before any torch work): keeps the
    calling thread's torch ops single-threaded, so that the encode stage's OpenMP team is the
    only one in the process. With a second team (libgomp counts every pool's threads) OpenMP
    workers stop spinning between ops and every parallel op pays a wake-up: measured 1.7x
    slower encoder steps on 2 cores (docs/performance.md)."""
    torch.set_num_threads(1)


SWITCH_INTERVAL = 0.00025  # seconds


def responsive_threads() -> None:
    """Shorten the interpreter's thread switch interval (5 ms by default) to SWITCH_INTERVAL, unless
    the program chose one already. Every torch call, and numpy's on large arrays, hands the GIL
    back; taking it back waits until the thread holding it reaches the interval. The stage threads
    make dozens of such calls a step beside the server's protocol work, so at 5 ms a step's host
    work stretched from 0.09 to 3.5-3.8 ms per chunk beside one busy Python thread; at 0.25 ms
    about 0.3 ms (docs/performance.md)."""
    if sys.getswitchinterval() >= 0.005:
        sys.setswitchinterval(SWITCH_INTERVAL)


def stage_threads(device: torch.device, encoder: bool, threads: int | None = None) -> int | None:
    """Intra-op threads of one engine stage thread; None: leave torch's default (off CPU).

    On CPU each thread has its own OpenMP team. Only the encoder's big matmuls gain from one
    (`threads`, by default every usable core); decoding is thousands of tiny ops (a fork/join each
    would cost more than the op), and a second team beside the encoder's would leave both waiting
    at barriers for threads the other one preempted. With every core in the encoder's team,
    the other stages run on its thread (`stages_beside`): on 2 cores that made every core the
    fastest team in float32 as well as bfloat16, where every core but one had been float32's
    (docs/performance.md, section 2).
    """
    if device.type != "cpu":
        return None
    if not encoder:
        return 1
    return threads or usable_cores()


def stages_beside(device: torch.device, team: int | None) -> bool:
    """Whether pre-encode and decode get threads of their own beside the encoder's: off CPU (the
    host prepares one step and decodes another while the device runs a third), or where the
    encoder's team leaves a core free. Where the team takes every core, a thread beside it only
    preempts it (a team waits at each op's barrier for a preempted thread), and a pre-encode
    thread formed steps early, on what had arrived by then: the whole step (schedule, pre-encode,
    encode, decode, results) then runs on the encode thread, with its team. On 2 cores that halved
    the chunk latency p95 below capacity and moved the finalization lag at 16-20 bfloat16 streams
    under 320 ms (docs/performance.md, section 2)."""
    return device.type != "cpu" or team is None or team < usable_cores()


def usable_cores() -> int:
    """The cores this process may use (intra-op threads per stage by default): those its CPU
    affinity allows, and no more than its cgroup's CPU quota (a container limited to 2 CPUs on a
    64-core host gets 2; threads beyond its quota only wait for their turn)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    quota = cpu_quota()
    return cores if quota is None else max(1, min(cores, math.ceil(quota)))


CGROUP = Path("/sys/fs/cgroup")


def cpu_quota(root: Path = CGROUP, membership: Path = Path("/proc/self/cgroup")) -> float | None:
    """CPUs the process's cgroup may use (its quota over its period), None where there is no
    quota: cgroup v2's cpu.max, else v1's cpu.cfs_quota_us / cpu.cfs_period_us."""
    for line in _read(membership).splitlines():
        hierarchy, controllers, path = (line.split(":", 2) + ["", ""])[:3]
        if hierarchy == "0":  # v2: "0::/path"
            found = _ratio(_read(root / path.lstrip("/") / "cpu.max").split()[:2])
        elif "cpu" in controllers.split(","):
            folder = root / "cpu" / path.lstrip("/")
            found = _ratio([_read(folder / "cpu.cfs_quota_us").strip(), _read(folder / "cpu.cfs_period_us").strip()])
        else:
            continue
        if found is not None:
            return found
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _ratio(fields: list[str]) -> float | None:
    """quota / period; None for no quota ("max", -1) or nothing readable."""
    try:
        quota, period = int(fields[0]), int(fields[1])
    except (IndexError, ValueError):
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_ram() -> int | None:
    """MemAvailable of this machine in bytes, or None where /proc/meminfo cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def free_memory(device: torch.device) -> int:
    """Free bytes of the device (CPU: available RAM; 1 GiB where it cannot tell)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_ram() or 1 << 30
