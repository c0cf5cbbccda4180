"""Registry entries for the direct-convolution days (01 naive, 02 z_out, ...).

Each entry has a Python model of its kernel's thread -> output mapping (``covers``), written
from the ``.cu`` file's header comment: it loops over the same grid and block the launch uses
and counts the writes to each output element. CPU tests check that every element is written
exactly once, for random problems and for grids capped at 65,535.
"""

from __future__ import annotations

import numpy as np

from .problem import Conv2dProblem
from .variants import MAX_GRID, LaunchConfig, Variant, register


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def same_fp32_nchw(p: Conv2dProblem) -> str | None:
    """The claim of days 01-02: stride 1, dilation 1, groups 1, odd filters, "same" padding."""
    if p.groups != 1:
        return f"needs groups=1; got {p.groups}"
    if p.stride != (1, 1):
        return f"needs stride 1; got {p.stride}"
    if p.dilation != (1, 1):
        return f"needs dilation 1; got {p.dilation}"
    if p.R % 2 == 0 or p.S % 2 == 0:
        return f"needs an odd filter (R and S odd); got R={p.R}, S={p.S}"
    want = ((p.R - 1) // 2, (p.S - 1) // 2)
    if p.padding != want:
        return f"needs 'same' padding {want} for a {p.R}x{p.S} filter; got {p.padding}"
    return None


def nchw_args(p: Conv2dProblem) -> tuple:
    """Scalar arguments ``N, C, H, W, K, R, S`` as ``np.int32`` (pycuda needs sized scalars)."""
    return tuple(np.int32(v) for v in (p.N, p.C, p.H, p.W, p.K, p.R, p.S))


def _grid_stride(n_items: int, per_block: int, grid: int) -> np.ndarray:
    """Count how often a grid-stride loop over ``grid*per_block`` threads visits each item."""
    counts = np.zeros(n_items, dtype=np.int64)
    for t in range(grid * per_block):  # the threads' starting indices
        counts[t :: grid * per_block] += 1
    return counts


# ---- day 01: naive ---------------------------------------------------------------------------
NAIVE_BLOCK = (32, 8, 1)


def naive_launch(p: Conv2dProblem) -> LaunchConfig:
    bx, by, _ = NAIVE_BLOCK
    return LaunchConfig(grid=(_cdiv(p.Q, bx), min(_cdiv(p.N * p.P, by), MAX_GRID[1]), 1), block=NAIVE_BLOCK)


def naive_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    bx, by, _ = cfg.block
    cols = np.zeros(p.Q, dtype=np.int64)
    for t in range(cfg.grid[0] * bx):  # thread column t writes q = t if t < Q
        if t < p.Q:
            cols[t] += 1
    rows = _grid_stride(p.N * p.P, by, cfg.grid[1])  # flattened rows n*P + p
    per_pixel = rows.reshape(p.N, 1, p.P, 1) * cols.reshape(1, 1, 1, p.Q)  # [N][1][P][Q]
    return np.broadcast_to(per_pixel, (p.N, p.K, p.P, p.Q)).ravel()  # every k, by the k loop


register(
    Variant(
        name="naive",
        day=1,
        cu_file="01_naive.cu",
        entry="conv2d_naive",
        summary="one thread per output pixel, all K channels in a loop, everything from global memory",
        supports_fn=same_fp32_nchw,
        launch_fn=naive_launch,
        args_fn=nchw_args,
        covers_fn=naive_covers,
    )
)


# ---- day 02: z_out ---------------------------------------------------------------------------
Z_OUT_BLOCK = (32, 8, 1)


def z_out_launch(p: Conv2dProblem) -> LaunchConfig:
    bx, by, _ = Z_OUT_BLOCK
    grid = (_cdiv(p.Q, bx), min(_cdiv(p.P, by), MAX_GRID[1]), min(p.N * p.K, MAX_GRID[2]))
    return LaunchConfig(grid=grid, block=Z_OUT_BLOCK)


def z_out_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    bx, by, _ = cfg.block
    cols = np.array([1 if q < cfg.grid[0] * bx else 0 for q in range(p.Q)], dtype=np.int64)
    rows = _grid_stride(p.P, by, cfg.grid[1])
    planes = _grid_stride(p.N * p.K, 1, cfg.grid[2])  # blockIdx.z steps over n*K + k
    return (planes.reshape(-1, 1, 1) * rows.reshape(1, -1, 1) * cols.reshape(1, 1, -1)).ravel()


register(
    Variant(
        name="z_out",
        day=2,
        cu_file="02_z_out.cu",
        entry="conv2d_z_out",
        summary="one output value per thread; blockIdx.z picks the (image, output channel) plane",
        supports_fn=same_fp32_nchw,
        launch_fn=z_out_launch,
        args_fn=nchw_args,
        covers_fn=z_out_covers,
    )
)
