"""Day 02: ``z_out``, one output value per thread, blockIdx.z picks the (image, output channel)
plane (``kernels/conv2d/02_z_out.cu``). fp32 NCHW, the claim of days 01-06.

``covers`` counts the writes per output element from the launch's grid (grid-stride loops in y
over rows and in z over planes n*K + k).
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
    int32_reason,
    same_conv_reason,
    single_kernel,
    stride_loop_reason,
    tap_offset_reason,
)

Z_OUT_BLOCK = (32, 8, 1)


def z_out_launch(p: Conv2dProblem) -> LaunchConfig:
    bx, by, _ = Z_OUT_BLOCK
    grid = (cdiv(p.Q, bx), min(cdiv(p.P, by), MAX_GRID[1]), min(p.N * p.K, MAX_GRID[2]))
    return LaunchConfig(grid=grid, block=Z_OUT_BLOCK)


def z_out_supports(p: Conv2dProblem) -> str | None:
    """The claim of days 01-06, within the kernel's 32-bit ints: the row loop
    ``for (int p = ...; p < H; p += gridDim.y * blockDim.y)`` (the last row plus the step must
    fit), the channel's filter offset ``c * R * S``, the input coordinates and the tap offset
    r*S + s of the taps inside the image."""
    reason = same_conv_reason(p)
    if reason:
        return reason
    step = z_out_launch(p).grid[1] * Z_OUT_BLOCK[1]
    return (
        stride_loop_reason("gridDim.y*blockDim.y", p.P - 1, step, "p")
        or int32_reason("the channel offset c*R*S for c = C-1", (p.C - 1) * p.R * p.S,
                        "the last channels' filters would be read at a wrapped offset")
        or input_reach_reason(p)
        or tap_offset_reason(p, every_tap=False)
    )


def z_out_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    bx, by, _ = cfg.block
    cols = np.array([1 if q < cfg.grid[0] * bx else 0 for q in range(p.Q)], dtype=np.int64)
    rows = grid_stride_counts(p.P, by, cfg.grid[1])
    planes = grid_stride_counts(p.N * p.K, 1, cfg.grid[2])  # blockIdx.z steps over n*K + k
    return (planes.reshape(-1, 1, 1) * rows.reshape(1, -1, 1) * cols.reshape(1, 1, -1)).ravel()


register(
    Variant(
        name="z_out",
        day=2,
        cu_file="02_z_out.cu",
        summary="one output value per thread; blockIdx.z picks the (image, output channel) plane",
        supports_fn=z_out_supports,
        launches_fn=single_kernel("conv2d_z_out", z_out_launch, f"x w y {NCHW_SIZES}"),
        covers_fn=z_out_covers,
    )
)
