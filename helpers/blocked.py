"""Registry entry for day 06: the register-blocked direct kernel (``kernels/conv2d/06_blocked.cu``).

One ``.cu`` file, fifteen entry points: the filter size R = S and the channels per thread KT
are template parameters, so `entry_fn` picks the instantiation for each problem.
"""

from __future__ import annotations

import numpy as np

from .direct import _grid_stride, nchw_args, same_fp32_nchw
from .problem import Conv2dProblem
from .variants import MAX_GRID, LaunchConfig, Variant, register

BLOCKED_DEFINES = {"BY": 8, "PT": 4, "CC": 4}  # must match the defaults documented in the .cu
BLOCKED_FILTERS = (1, 3, 5, 7, 9)
TQ = 32


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def blocked_kt(p: Conv2dProblem) -> int:
    """Output channels per thread: 8 when K >= 8, else 4 when K >= 4, else 1."""
    return 8 if p.K >= 8 else 4 if p.K >= 4 else 1


def blocked_supports(p: Conv2dProblem) -> str | None:
    reason = same_fp32_nchw(p)
    if reason:
        return reason
    if p.R != p.S or p.R not in BLOCKED_FILTERS:
        return f"needs a square filter with R = S in {BLOCKED_FILTERS}; got {p.R}x{p.S} (use `general`)"
    return None


def blocked_entry(p: Conv2dProblem) -> str:
    return f"conv2d_blocked_r{p.R}_k{blocked_kt(p)}"


def blocked_launch(p: Conv2dProblem) -> LaunchConfig:
    by, pt, cc = (BLOCKED_DEFINES[k] for k in ("BY", "PT", "CC"))
    tp, kt = by * pt, blocked_kt(p)
    grid = (_cdiv(p.Q, TQ), min(_cdiv(p.P, tp), MAX_GRID[1]), min(p.N * _cdiv(p.K, kt), MAX_GRID[2]))
    smem = 4 * cc * ((tp + p.R - 1) * (TQ + p.S - 1) + p.R * p.S * kt)
    return LaunchConfig(grid=grid, block=(TQ, by, 1), shared_bytes=smem)


def blocked_args(p: Conv2dProblem) -> tuple:
    return nchw_args(p)[:5]  # N, C, H, W, K: R and S are compiled in


def blocked_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    by, pt = BLOCKED_DEFINES["BY"], BLOCKED_DEFINES["PT"]
    tp, kt = by * pt, blocked_kt(p)
    cols = np.zeros(p.Q, dtype=np.int64)
    for q in range(cfg.grid[0] * TQ):  # thread column q stores if q < Q
        if q < p.Q:
            cols[q] += 1
    tiles = _grid_stride(_cdiv(p.P, tp), 1, cfg.grid[1])  # row tiles visited by blockIdx.y
    rows = np.repeat(tiles, tp)[: p.P]  # each tile's threads store rows p0 .. p0+TP-1 (< P)
    k_tiles = _cdiv(p.K, kt)
    planes = _grid_stride(p.N * k_tiles, 1, cfg.grid[2]).reshape(p.N, k_tiles)
    per_k = np.repeat(planes, kt, axis=1)[:, : p.K]  # each (n, k-tile) stores k0 .. k0+KT-1 (< K)
    return (per_k.reshape(p.N, p.K, 1, 1) * rows.reshape(1, 1, -1, 1) * cols.reshape(1, 1, 1, -1)).ravel()


register(
    Variant(
        name="blocked",
        day=6,
        cu_file="06_blocked.cu",
        entry="conv2d_blocked_r3_k8",
        entry_fn=blocked_entry,
        summary="register blocking: each thread computes 4 rows x KT channels from shared-memory tiles",
        supports_fn=blocked_supports,
        launch_fn=blocked_launch,
        args_fn=blocked_args,
        covers_fn=blocked_covers,
        defines=BLOCKED_DEFINES,
    )
)
