"""Facts and policy of the machine the process runs on: cores, free memory, host threads."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def single_threaded_host() -> None:
    """Call first thing in a program that runs an ASREngine (before any torch work): keeps the
    calling thread's torch ops single-threaded, so that the encode stage's OpenMP team is the
    only one in the process. With a second team (libgomp counts every pool's threads) OpenMP
    workers stop spinning between ops and every parallel op pays a wake-up: measured 1.7x
    slower encoder steps on 2 cores (docs/performance.md)."""
    torch.set_num_threads(1)


def usable_cores() -> int:
    """The cores this process may use (intra-op threads per stage by default)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def available_ram() -> int | None:
    """MemAvailable of this machine in bytes, or None where /proc/meminfo cannot tell."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
