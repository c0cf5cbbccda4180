"""Day 01: ``naive``, one thread per output pixel (``kernels/conv2d/01_naive.cu``).

Thread (x, y) of the grid owns output column q = x and the flattened row n*P + p = y (a
grid-stride loop past 65,535 blocks in y) and loops over all K output channels, reading x and w
from global memory. fp32 NCHW; the claim of days 01-06 (`days.kit.same_conv_reason`).

``covers`` is a Python model of the launch, written from the ``.cu`` file's header comment: it
loops over the same grid and block and counts the writes to each output element; CPU tests check
that every element is written exactly once.
"""

from __future__ import annotations

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import MAX_GRID, LaunchConfig, Variant, register

from .kit import (
    NCHW_SIZES,
    cdiv,
    grid_stride_counts,
    input_reach_reason,
    same_conv_reason,
    single_kernel,
    tap_offset_reason,
)

NAIVE_BLOCK = (32, 8, 1)


def naive_launch(p: Conv2dProblem) -> LaunchConfig:
    bx, by, _ = NAIVE_BLOCK
    return LaunchConfig(grid=(cdiv(p.Q, bx), min(cdiv(p.N * p.P, by), MAX_GRID[1]), 1), block=NAIVE_BLOCK)


def naive_supports(p: Conv2dProblem) -> str | None:
    """The claim of days 01-06 (`days.kit.same_conv_reason`), within the kernel's 32-bit ints: the
    input coordinates p - pad_h + r and q - pad_w + s (`days.kit.input_reach_reason`; the flat
    row loop is 64-bit) and the filter offset r*S + s of the taps inside the image, the only ones
    it is formed for (`days.kit.tap_offset_reason`)."""
    return same_conv_reason(p) or input_reach_reason(p) or tap_offset_reason(p, every_tap=False)


def naive_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    bx, by, _ = cfg.block
    cols = np.zeros(p.Q, dtype=np.int64)
    for t in range(cfg.grid[0] * bx):  # thread column t writes q = t if t < Q
        if t < p.Q:
            cols[t] += 1
    rows = grid_stride_counts(p.N * p.P, by, cfg.grid[1])  # flattened rows n*P + p
    per_pixel = rows.reshape(p.N, 1, p.P, 1) * cols.reshape(1, 1, 1, p.Q)  # [N][1][P][Q]
    return np.broadcast_to(per_pixel, (p.N, p.K, p.P, p.Q)).ravel()  # every k, by the k loop


register(
    Variant(
        name="naive",
        day=1,
        cu_file="01_naive.cu",
        summary="one thread per output pixel, all K channels in a loop, everything from global memory",
        supports_fn=naive_supports,
        launches_fn=single_kernel("conv2d_naive", naive_launch, f"x w y {NCHW_SIZES}"),
        covers_fn=naive_covers,
    )
)
