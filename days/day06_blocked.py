"""Day 06: ``blocked``, the register-blocked direct kernel (``kernels/conv2d/06_blocked.cu``).

One ``.cu`` file, twenty-one entry points: the filter size R = S, the output channels per thread
KT and the thread groups along K (KG) are template parameters, so the variant picks the
instantiation for each problem. 1x1 filters with K >= 32 go to a GEMM tile instead (BM output
channels x 128 pixels per block, BM in {64, 128}). `make_blocked` builds the variant for any
compile-time configuration (the registered one uses the defaults), so a notebook can compare
settings.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, MAX_GRID, LaunchConfig, Variant, register

from .kit import (
    cdiv,
    ceil_div_reason,
    gemm_writes,
    grid_stride_counts,
    input_reach_reason,
    same_conv_reason,
    single_kernel,
    stride_loop_reason,
)

BLOCKED_DEFINES = {"BY": 8, "PT": 4}  # the defaults documented in the .cu
BLOCKED_FILTERS = (1, 3, 5, 7, 9)
TQ = 32  # output columns per block: one warp along q


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


GEMM_BN, GEMM_THREADS = 128, 256  # pixels per block and threads of the 1x1 GEMM tile (G_BN, G_THREADS)


def uses_gemm_tile(p: Conv2dProblem) -> bool:
    """1x1 filters with K >= 32 run ``conv2d_blocked_1x1_m{BM}``: Y[n] = W . X[n] as a GEMM tile."""
    return p.R == 1 and p.K >= 32


def default_gemm_bm(p: Conv2dProblem) -> int:
    """Output channels per block of the 1x1 GEMM tile: 128 (8 x 8 outputs per thread, one block
    per SM) when K >= 128, else 64 (4 x 8, two blocks per SM). On the H200, BM = 128 was as fast
    or faster on every 1x1 problem with K >= 128 that was timed (seed suite and ResNet-50-like
    shapes), and slower on K = 32 and 64.
    """
    return 128 if p.K >= 128 else 64


def blocked_supports(p: Conv2dProblem, defines: dict = BLOCKED_DEFINES, kt_rule=default_kt) -> str | None:
    """The claim of days 01-06 with a square filter of `BLOCKED_FILTERS`, within the kernels'
    32-bit ints. The GEMM tile (1x1, K >= 32): filter offsets up to K*C and its image loop. The
    direct entries: the channel-stage loop, ``k_tiles = CEIL_DIV(K, TK)``, the row-tile loop
    (the last tile's start plus gridDim.y * TP must fit) and the input coordinates of the tiles."""
    reason = same_conv_reason(p)
    if reason:
        return reason
    if p.R != p.S or p.R not in BLOCKED_FILTERS:
        return f"needs a square filter with R = S in {BLOCKED_FILTERS}; got {p.R}x{p.S} (use `general`)"
    if uses_gemm_tile(p):
        if p.K * p.C > INT32_MAX:
            return f"the 1x1 GEMM tile indexes the filter with 32-bit offsets; K*C = {p.K * p.C} is too large"
        # the image loop: for (int n = blockIdx.z; n < N; n += gridDim.z)
        return stride_loop_reason("gridDim.z", p.N - 1, min(p.N, MAX_GRID[2]), "n")
    cc = stage_channels(p, defines, prefetches(p, defines, kt_rule))
    if p.C - 1 + cc > INT32_MAX:  # the int stage loop, c0 += CC while c0 < C, must not wrap
        return f"C = {p.C} is within one stage ({cc} channels) of INT32_MAX: the kernel's 32-bit channel loop wraps"
    # k_tiles = CEIL_DIV(K, TK); the row loop for (int p0 = blockIdx.y * TP; p0 < P; p0 += gridDim.y * TP);
    # the input coordinates of every row of the row tiles and every column of the 32-wide column tiles.
    tp, tk = _tile(p, defines, kt_rule)
    row_tiles = cdiv(p.P, tp)
    return (
        ceil_div_reason("k_tiles", p.K, tk)
        or stride_loop_reason(f"gridDim.y*TP (TP = {tp})", (row_tiles - 1) * tp, min(row_tiles, MAX_GRID[1]) * tp, "p0")
        or input_reach_reason(p, rows=row_tiles * tp, cols=cdiv(p.Q, TQ) * TQ)
    )


def _tile(p: Conv2dProblem, defines: dict, kt_rule) -> tuple[int, int]:
    """(TP, TK): output rows and output channels of one block (it always covers 32 columns)."""
    kt, kg = kt_rule(p)
    return (defines["BY"] // kg) * defines["PT"], kg * kt


def _entry(p: Conv2dProblem, kt_rule, bm_rule) -> str:
    if uses_gemm_tile(p):
        return f"conv2d_blocked_1x1_m{bm_rule(p)}"
    kt, kg = kt_rule(p)
    return f"conv2d_blocked_r{p.R}_k{kt}_g{kg}"


def _launch(p: Conv2dProblem, defines: dict, kt_rule, bm_rule) -> LaunchConfig:
    if uses_gemm_tile(p):  # static shared memory only
        return LaunchConfig(
            grid=(cdiv(p.H * p.W, GEMM_BN), cdiv(p.K, bm_rule(p)), min(p.N, MAX_GRID[2])), block=(GEMM_THREADS, 1, 1)
        )
    tp, tk = _tile(p, defines, kt_rule)
    pf = prefetches(p, defines, kt_rule)
    cc = stage_channels(p, defines, pf)
    grid = (cdiv(p.Q, TQ), min(cdiv(p.P, tp), MAX_GRID[1]), min(p.N * cdiv(p.K, tk), MAX_GRID[2]))
    smem = (2 if pf else 1) * 4 * cc * ((tp + p.R - 1) * (TQ + p.S - 1) + p.R * p.S * tk)
    return LaunchConfig(grid=grid, block=(TQ, defines["BY"], 1), shared_bytes=smem)


def _covers(p: Conv2dProblem, cfg: LaunchConfig, defines: dict, kt_rule, bm_rule) -> np.ndarray:
    if uses_gemm_tile(p):
        # Per image a K x H*W GEMM: blockIdx.y covers channels y*BM .. +BM-1, blockIdx.x pixels
        # x*128 .. +127 (stores guarded by < K and < HW); blockIdx.z the images n = z, z + gridDim.z, ...
        bm = bm_rule(p)
        visits = np.outer(np.bincount(np.arange(cfg.grid[1]), minlength=cdiv(p.K, bm)),
                          np.bincount(np.arange(cfg.grid[0]), minlength=cdiv(p.H * p.W, GEMM_BN)))
        per_image = gemm_writes(p.K, p.H * p.W, bm, GEMM_BN, visits)
        imgs = grid_stride_counts(p.N, 1, cfg.grid[2])
        return (imgs[:, None] * per_image[None, :]).ravel()
    tp, tk = _tile(p, defines, kt_rule)
    cols = np.zeros(p.Q, dtype=np.int64)
    for q in range(cfg.grid[0] * TQ):  # thread column q stores if q < Q
        if q < p.Q:
            cols[q] += 1
    tiles = grid_stride_counts(cdiv(p.P, tp), 1, cfg.grid[1])  # row tiles visited by blockIdx.y
    rows = np.repeat(tiles, tp)[: p.P]  # a tile's threads store rows p0 .. p0+TP-1 (< P)
    k_tiles = cdiv(p.K, tk)
    planes = grid_stride_counts(p.N * k_tiles, 1, cfg.grid[2]).reshape(p.N, k_tiles)
    per_k = np.repeat(planes, tk, axis=1)[:, : p.K]  # an (n, k-tile) stores k0 .. k0+TK-1 (< K)
    return (per_k.reshape(p.N, p.K, 1, 1) * rows.reshape(1, 1, -1, 1) * cols.reshape(1, 1, 1, -1)).ravel()


def make_blocked(
    name: str = "blocked",
    defines: dict | None = None,
    kt_rule: Callable[[Conv2dProblem], tuple[int, int]] = default_kt,
    bm_rule: Callable[[Conv2dProblem], int] = default_gemm_bm,
) -> Variant:
    """The day-06 variant for one compile-time configuration (not registered).

    Args:
        name: the variant's name.
        defines: overrides of the .cu's -D parameters: ``BY`` (thread rows, default 8), ``PT``
            (rows per thread, 4), ``C_STAGE`` (input channels per stage), ``MINB`` (blocks per
            SM for __launch_bounds__), ``LOAD_UNROLL`` (unrolling of the tile loads),
            ``PREFETCH`` (0/1: double-buffered stages in the K >= 32 entries of 1x1 and 3x3).
        kt_rule: problem -> (KT, KG), which must be one of the instantiated pairs
            (1, 1), (4, 1), (8, 1), (8, 4) ((8, 4) has no 1x1 entry: K >= 32 takes the GEMM tile).
        bm_rule: problem -> BM, the output channels per block of the 1x1 GEMM tile (64 or 128).
    """
    d = {**BLOCKED_DEFINES, **(defines or {})}
    return Variant(
        name=name,
        day=6,
        cu_file="06_blocked.cu",
        summary="register blocking: 4 rows x 8 channels per thread from shared-memory tiles; 1x1: a GEMM tile",
        supports_fn=partial(blocked_supports, defines=d, kt_rule=kt_rule),
        launches_fn=single_kernel(partial(_entry, kt_rule=kt_rule, bm_rule=bm_rule),
                                  partial(_launch, defines=d, kt_rule=kt_rule, bm_rule=bm_rule),
                                  "x w y N C H W K"),  # R and S are compiled in
        covers_fn=partial(_covers, defines=d, kt_rule=kt_rule, bm_rule=bm_rule),
        defines=d,
    )


register(make_blocked())
