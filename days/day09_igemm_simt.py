"""Day 09: implicit GEMM on CUDA cores, NHWC fp32.

Two variants, both kept so the notebook can compare them:

* ``igemm_simt_analytic`` (``kernels/conv2d/09_igemm_simt_analytic.cu``): 64 x 64 block tile,
  4 x 4 per thread, every load decodes its (pixel, tap, channel) with divisions;
* ``igemm_simt`` (``kernels/conv2d/09_igemm_simt.cu``): tile descriptions from 64 x 64 to
  128 x 128 (8 x 8 per thread), tap-major GEMM-K walk without divisions, 16-byte loads where
  C % 4 == 0 (scalar loads otherwise), double-buffered shared memory.

The GEMM view (GEMM-M = N·P·Q, GEMM-N = K, GEMM-K = R·S·C) follows NVIDIA's CUTLASS
"Implicit GEMM Convolution" documentation (docs/implicit_gemm_convolution.md) and
Chetlur et al., "cuDNN: Efficient Primitives for Deep Learning" (2014), section 3.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import LaunchConfig, Variant, register

from .kit import (
    FULL_SIZES,
    VEC_BYTES,
    alignment_reason,
    blocks,
    cdiv,
    chunks16,
    gemm_tile_launch,
    gemm_writes,
    groups_one_reason,
    implicit_gemm_int32_reason,
    input_reach_reason,
    single_kernel,
    tile_visits,
)

THREADS = 256  # both kernels
ANALYTIC_TILE = (64, 64)
TILES = ((128, 128), (128, 64), (64, 128), (64, 64))  # the instantiated (BM, BN) of 09_igemm_simt.cu


@dataclass(frozen=True)
class Tile:
    """A tile description of ``09_igemm_simt.cu``: BM pixels (GEMM-M) x BN channels (GEMM-N) per
    block, BK = 8 steps of GEMM-K per stage, 256 threads with a BM/16 x BN/16 register tile."""

    bm: int
    bn: int

    def __post_init__(self):
        if (self.bm, self.bn) not in TILES:
            raise ValueError(f"no entry point for a {self.bm} x {self.bn} tile; instantiated: {TILES}")

    @property
    def thread_tile(self) -> tuple[int, int]:
        return self.bm // 16, self.bn // 16

    @property
    def shared_bytes(self) -> int:
        """Static shared memory: two stages of sa[8][BM+4] and sb[8][BN+4] floats."""
        return 2 * 8 * (self.bm + 4 + self.bn + 4) * 4


def igemm_supports(p: Conv2dProblem) -> str | None:
    """What both day-09 kernels (and days 10 and 11) take: groups = 1 (any stride, padding,
    dilation, filter, C, K), within their 32-bit index arithmetic
    (`days.kit.implicit_gemm_int32_reason`) and 32-bit input coordinates h0 + r*dh, w0 + s*dw
    with h0 = p*sh - ph, w0 = q*sw - pw (`days.kit.input_reach_reason`)."""
    return groups_one_reason(p) or implicit_gemm_int32_reason(p) or input_reach_reason(p)


# The tile rule, from the tile sweep over the ResNet-50 layers at N = 32 and 256 on the H200
# (132 SMs; day 09's notebook repeats it): 128 x 128 was the fastest tile wherever it made at
# least ~100 blocks, except for K = 64, where a 128-channel tile is half empty (128 x 64 won).
# With fewer blocks (52, on the 7 x 7 and strided 14 x 14 layers at N = 32) 128 x 64, with twice
# the blocks, won. Below MIN_BLOCKS the rule halves the tile.
MIN_BLOCKS = 88  # two thirds of the H200's 132 SMs


def default_tile(p: Conv2dProblem) -> Tile:
    """The tile description ``igemm_simt`` runs for ``p``: the first of 128 x BN, 128 x 64, 64 x 64
    (BN = 64 if K <= 64 else 128) that gives at least `MIN_BLOCKS` blocks, else 64 x 64."""
    bn = 64 if p.K <= 64 else 128
    for t in (Tile(128, bn), Tile(128, 64)):
        if blocks(p, t) >= MIN_BLOCKS:
            return t
    return Tile(64, 64)


def vec_path(p: Conv2dProblem) -> bool:
    """16-byte loads when a pixel's C channels split into 16-byte chunks (`days.kit.chunks16`):
    C % 4 == 0 for fp32 (a float4), C % 8 == 0 for fp16/bf16 (days 10-11)."""
    return chunks16(p.C, p)


def _entry(p: Conv2dProblem, tile_rule) -> str:
    t = tile_rule(p)
    return f"conv2d_igemm_simt_{t.bm}x{t.bn}_{'vec' if vec_path(p) else 'scalar'}"


def _launch(p: Conv2dProblem, tile_rule) -> LaunchConfig:
    t = tile_rule(p)
    return gemm_tile_launch(p, t.bm, t.bn, THREADS)


def tile_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: Tile) -> np.ndarray:
    """Writes per element of Y[m][k] (the NHWC output, flat): block (bx, by) stores rows
    bx*BM .. +BM-1 (< M) and columns by*BN .. +BN-1 (< K), each once (days 09 and 11)."""
    visits = tile_visits(cfg.grid, cdiv(p.gemm.m, tile.bm), cdiv(p.K, tile.bn))
    return gemm_writes(p.gemm.m, p.K, tile.bm, tile.bn, visits)


def igemm_pointer_check(p: Conv2dProblem, tensors: dict, epilogue=None) -> str | None:
    """The vector entries' alignment: x and w 16-byte aligned when C % 4 == 0, y (if given) when
    K % 4 == 0. Returns None or the reason (`helpers.launch.prepare` raises it as ValueError)."""
    need = {"x": VEC_BYTES, "w": VEC_BYTES} if vec_path(p) else {}
    if chunks16(p.K, p):
        need["y"] = VEC_BYTES
    return alignment_reason(tensors, need, "the 16-byte loads/stores")


def make_igemm(name: str = "igemm_simt", tile_rule: Callable[[Conv2dProblem], Tile] = default_tile) -> Variant:
    """The optimized day-09 variant with a given tile rule (not registered).

    Args:
        name: the variant's name.
        tile_rule: problem -> `Tile`, one of `TILES` (default `default_tile`); e.g.
            ``lambda p: Tile(128, 64)`` forces one tile description for every problem.
    """
    return Variant(
        name=name,
        day=9,
        cu_file="09_igemm_simt.cu",
        summary="implicit GEMM, CUDA cores: up to 128x128 tiles, 8x8 per thread, float4 loads, double buffering",
        supports_fn=igemm_supports,
        launches_fn=single_kernel(partial(_entry, tile_rule=tile_rule), partial(_launch, tile_rule=tile_rule),
                                  f"x w y {FULL_SIZES} groups"),
        covers_fn=lambda p, cfg: tile_covers(p, cfg, tile_rule(p)),
        layouts=("NHWC",),
        tensor_check_fn=igemm_pointer_check,
    )


register(
    Variant(
        name="igemm_simt_analytic",
        day=9,
        cu_file="09_igemm_simt_analytic.cu",
        summary="implicit GEMM, CUDA cores, readable: 64x64 tile, 4x4 per thread, index divisions per load",
        supports_fn=igemm_supports,
        launches_fn=single_kernel("conv2d_igemm_simt_analytic",
                                  partial(_launch, tile_rule=lambda p: Tile(*ANALYTIC_TILE)),
                                  f"x w y {FULL_SIZES} groups"),
        covers_fn=lambda p, cfg: tile_covers(p, cfg, Tile(*ANALYTIC_TILE)),
        layouts=("NHWC",),
    )
)
register(make_igemm())
