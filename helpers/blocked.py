"""Registry entry for day 06: the register-blocked direct kernel (``kernels/conv2d/06_blocked.cu``).

One ``.cu`` file, twenty entry points: the filter size R = S, the output channels per thread KT
and the thread groups along K (KG) are template parameters, so the variant's ``entry_fn`` picks
the instantiation for each problem. `make_blocked` builds the variant for any compile-time
configuration (the registered one uses the defaults), so a notebook can compare settings.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from .direct import _grid_stride, nchw_args, same_fp32_nchw
from .problem import Conv2dProblem
from .variants import MAX_GRID, LaunchConfig, Variant, register

BLOCKED_DEFINES = {"BY": 8, "PT": 4}  # the defaults documented in the .cu
BLOCKED_FILTERS = (1, 3, 5, 7, 9)
TQ = 32  # output columns per block: one warp along q


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def default_kt(p: Conv2dProblem) -> tuple[int, int]:
    """(KT, KG): output channels per thread and thread groups along K.

    K >= 32: (8, 4), so a block covers 32 channels; K >= 8: (8, 1); K >= 4: (4, 1); else (1, 1).
    """
    if p.K >= 32:
        return 8, 4
    return (8, 1) if p.K >= 8 else (4, 1) if p.K >= 4 else (1, 1)


def prefetches(p: Conv2dProblem, defines: dict, kt_rule) -> bool:
    """Whether the entry for ``p`` double-buffers its stages, as ``PF_FOR(R)`` in the .cu."""
    if kt_rule(p)[1] != 4:
        return False
    return bool(defines["PREFETCH"]) if "PREFETCH" in defines else p.R <= 3


def stage_channels(p: Conv2dProblem, defines: dict, pf: bool) -> int:
    """Input channels per shared-memory stage, as ``CC_FOR(R, PF)`` in the .cu."""
    if "C_STAGE" in defines:
        return defines["C_STAGE"]
    if pf:
        return 8 if p.R == 1 else 4
    return 32 if p.R == 1 else 8 if p.R == 3 else 4


def blocked_supports(p: Conv2dProblem) -> str | None:
    reason = same_fp32_nchw(p)
    if reason:
        return reason
    if p.R != p.S or p.R not in BLOCKED_FILTERS:
        return f"needs a square filter with R = S in {BLOCKED_FILTERS}; got {p.R}x{p.S} (use `general`)"
    return None


def _tile(p: Conv2dProblem, defines: dict, kt_rule) -> tuple[int, int]:
    """(TP, TK): output rows and output channels of one block (it always covers 32 columns)."""
    kt, kg = kt_rule(p)
    return (defines["BY"] // kg) * defines["PT"], kg * kt


def _entry(p: Conv2dProblem, kt_rule) -> str:
    kt, kg = kt_rule(p)
    return f"conv2d_blocked_r{p.R}_k{kt}_g{kg}"


def _launch(p: Conv2dProblem, defines: dict, kt_rule) -> LaunchConfig:
    tp, tk = _tile(p, defines, kt_rule)
    pf = prefetches(p, defines, kt_rule)
    cc = stage_channels(p, defines, pf)
    grid = (_cdiv(p.Q, TQ), min(_cdiv(p.P, tp), MAX_GRID[1]), min(p.N * _cdiv(p.K, tk), MAX_GRID[2]))
    smem = (2 if pf else 1) * 4 * cc * ((tp + p.R - 1) * (TQ + p.S - 1) + p.R * p.S * tk)
    return LaunchConfig(grid=grid, block=(TQ, defines["BY"], 1), shared_bytes=smem)


def _covers(p: Conv2dProblem, cfg: LaunchConfig, defines: dict, kt_rule) -> np.ndarray:
    tp, tk = _tile(p, defines, kt_rule)
    cols = np.zeros(p.Q, dtype=np.int64)
    for q in range(cfg.grid[0] * TQ):  # thread column q stores if q < Q
        if q < p.Q:
            cols[q] += 1
    tiles = _grid_stride(_cdiv(p.P, tp), 1, cfg.grid[1])  # row tiles visited by blockIdx.y
    rows = np.repeat(tiles, tp)[: p.P]  # a tile's threads store rows p0 .. p0+TP-1 (< P)
    k_tiles = _cdiv(p.K, tk)
    planes = _grid_stride(p.N * k_tiles, 1, cfg.grid[2]).reshape(p.N, k_tiles)
    per_k = np.repeat(planes, tk, axis=1)[:, : p.K]  # an (n, k-tile) stores k0 .. k0+TK-1 (< K)
    return (per_k.reshape(p.N, p.K, 1, 1) * rows.reshape(1, 1, -1, 1) * cols.reshape(1, 1, 1, -1)).ravel()


def make_blocked(
    name: str = "blocked",
    defines: dict | None = None,
    kt_rule: Callable[[Conv2dProblem], tuple[int, int]] = default_kt,
) -> Variant:
    """The day-06 variant for one compile-time configuration (not registered).

    Args:
        name: the variant's name.
        defines: overrides of the .cu's -D parameters: ``BY`` (thread rows, default 8), ``PT``
            (rows per thread, 4), ``C_STAGE`` (input channels per stage), ``MINB`` (blocks per
            SM for __launch_bounds__), ``LOAD_UNROLL`` (unrolling of the tile loads),
            ``PREFETCH`` (0/1: double-buffered stages in the K >= 32 entries of 1x1 and 3x3).
        kt_rule: problem -> (KT, KG), which must be one of the instantiated pairs
            (1, 1), (4, 1), (8, 1), (8, 4).
    """
    d = {**BLOCKED_DEFINES, **(defines or {})}
    return Variant(
        name=name,
        day=6,
        cu_file="06_blocked.cu",
        entry="conv2d_blocked_r3_k8_g4",
        entry_fn=partial(_entry, kt_rule=kt_rule),
        summary="register blocking: each thread computes 4 rows x 8 channels from shared-memory tiles",
        supports_fn=blocked_supports,
        launch_fn=partial(_launch, defines=d, kt_rule=kt_rule),
        args_fn=lambda p: nchw_args(p)[:5],  # N, C, H, W, K: R and S are compiled in
        covers_fn=partial(_covers, defines=d, kt_rule=kt_rule),
        defines=d,
    )


register(make_blocked())
