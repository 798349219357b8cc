"""Checking a --device before any weights move to it, and moving values between it and the host."""

from __future__ import annotations

import numpy as np
import torch

from .errors import DeviceError


AUTO = "auto"


def resolve_device(name: str) -> str:
    """`auto`: cuda where torch sees a GPU, else cpu (every tool's default); any other name as given."""
    if name == AUTO:
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def check_device(device: str | torch.device) -> torch.device:
    """`device` as a torch.device, or DeviceError with a one-line reason where this torch cannot use it."""
    try:
        device = torch.device(device)
    except RuntimeError:
        raise DeviceError(f"unknown device {str(device)!r} (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise DeviceError(f"--device {device}: this torch {torch.__version__} is a CPU-only build "
                              "(install a CUDA build of torch, or use --device cpu)")
        if not torch.cuda.is_available():
            raise DeviceError(f"--device {device}: no CUDA GPU is visible to torch (use --device cpu)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise DeviceError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s)")
    elif device.type not in ("cpu", "meta") and not _backend_available(device.type):
        raise DeviceError(f"--device {device}: not available in this torch build")
    return device


def _backend_available(kind: str) -> bool:
    backend = getattr(torch, kind, None) or getattr(torch.backends, kind, None)
    return bool(backend is not None and getattr(backend, "is_available", lambda: False)())


def to_device(values: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Host values on `device` without the host waiting: on CUDA through pinned memory, the copy
    queued on the current stream (a copy from pageable memory may wait for the stream's work)."""
    host = torch.as_tensor(values)
    if device.type == "cpu":
        return host
    if device.type != "cuda":  # any other backend (and `meta`, the host benchmark's device without arithmetic)
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def device_index(values: list[int] | np.ndarray, device: torch.device) -> torch.Tensor:
    """Host integers on `device` as int64 (an index), without a blocking copy."""
    return to_device(torch.as_tensor(np.asarray(values, np.int64)), device)


def to_host(tensors: list[torch.Tensor], device: torch.device) -> list[np.ndarray]:
    """Every tensor on the host in one copy and one wait (a step's labels, every batch's at once)."""
    if not tensors:
        return []
    flat = torch.cat([t.flatten() for t in tensors])
    if device.type == "cuda":
        host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
        host.copy_(flat, non_blocking=True)
        copied = torch.cuda.Event(blocking=True)  # the thread sleeps while the step runs (CUDA would spin a core)
        copied.record()
        copied.synchronize()
        flat = host
    parts = np.split(flat.numpy(), np.cumsum([t.numel() for t in tensors])[:-1])
    return [part.reshape(t.shape) for part, t in zip(parts, tensors)]


def next_size(size: int, waste: float = 0.125, dense: int = 64) -> int:
    """The batch size after `size` in the fixed sizes a GPU runs (graphs, cuFFT and cuDNN plans are
    made once per shape): powers of two up to `dense` rows, where a GPU step's time is flat, then
    steps that pad a batch by less than `waste` of its size."""
    return size * 2 if size < dense else size + max(1, int(size * waste))


def padded_size(n: int) -> int:
    """The fixed size a batch of n rows pads to (`next_size`'s sequence)."""
    size = 1
    while size < n:
        size = next_size(size)
    return size
