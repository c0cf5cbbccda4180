"""Timing GPU work with CUDA events: warm-up, L2 flushed outside the window, median and spread.

Each repetition is: flush L2 (write a buffer twice the L2's size), keep the GPU busy for about
0.1 ms (`GPU_LEAD_CYCLES`), record a start event, run the function, record an end event. The
flush is queued before the start event, so it is not timed, and the timed run starts from a cold
L2 the way a layer in a network usually does. The busy wait matters for kernels of a few tens of
microseconds: without it, when the host needs longer to launch the function (torch's dispatch,
pycuda's argument packing) than the GPU needs for the flush, the GPU sits idle between the start
event and the kernel, and that host time lands inside the window. Only after all repetitions do
we synchronise and read the events. We report the median with the 20th and 80th percentiles, in
milliseconds.

This follows the practice of ``triton.testing.do_bench`` (which by default returns the mean and
flushes 256 MB); we keep the median, and size the flush to the device's L2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Milliseconds per call: median (``ms_p50``), 20th and 80th percentiles, and the sample count."""

    ms_p50: float
    ms_p20: float
    ms_p80: float
    reps: int


@functools.cache
def _flush_buffer(device: int) -> torch.Tensor:
    l2 = torch.cuda.get_device_properties(device).L2_cache_size or 64 * 2**20
    return torch.empty(2 * l2, dtype=torch.uint8, device=f"cuda:{device}")


GPU_LEAD_CYCLES = 200_000  # ~0.1 ms at 2 GHz: longer than launching one conv from Python


def gpu_lead() -> None:
    """Queue a kernel that spins for `GPU_LEAD_CYCLES` clock cycles, so the GPU is still busy
    while the host records the start event and launches the timed work behind it."""
    torch.cuda._sleep(GPU_LEAD_CYCLES)


def flush_l2() -> None:
    """Evict the L2 cache by writing a buffer twice its size (allocated once per device)."""
    _flush_buffer(torch.cuda.current_device()).zero_()


def time_gpu(
    fn: Callable[[], object],
    *,
    warmup: int = 3,
    reps: int | None = None,
    target_ms: float = 200.0,
    min_reps: int = 5,
    max_reps: int = 200,
    flush: bool = True,
) -> Timing:
    """Time ``fn`` (which queues GPU work on the current stream) with CUDA events.

    Args:
        fn: launches the work; must not synchronise (that would put host time in the window).
        warmup: untimed calls first (compilation, cuDNN autotuning, clocks ramping up).
        reps: repetitions; by default as many as fit ``target_ms`` of GPU time, clamped to
            ``[min_reps, max_reps]``.
        flush: flush L2 before each repetition (outside the timed window).

    Returns:
        `Timing` in milliseconds.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    if reps is None:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if flush:
            flush_l2()
        gpu_lead()
        s.record()
        fn()
        e.record()
        e.synchronize()
        est = max(s.elapsed_time(e), 1e-3)
        reps = int(min(max_reps, max(min_reps, target_ms / est)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        if flush:
            flush_l2()
        gpu_lead()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    ms = torch.tensor([s.elapsed_time(e) for s, e in zip(starts, ends)], dtype=torch.float64)
    q = torch.quantile(ms, torch.tensor([0.5, 0.2, 0.8], dtype=torch.float64))
    return Timing(ms_p50=float(q[0]), ms_p20=float(q[1]), ms_p80=float(q[2]), reps=reps)
