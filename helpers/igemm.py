"""Registry entries for day 09: implicit GEMM on CUDA cores, NHWC fp32.

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

from .general import full_args
from .problem import Conv2dProblem
from .variants import INT32_MAX, LaunchConfig, Variant, register

THREADS = 256  # both kernels
ANALYTIC_TILE = (64, 64)
TILES = ((128, 128), (128, 64), (64, 128), (64, 64))  # the instantiated (BM, BN) of 09_igemm_simt.cu
VEC_ALIGN = 16  # bytes: the float4 loads and stores
# GEMM-K = R*S*C is an int in the kernels, and so are their GEMM-K walks, which step by up to 32
# channels (CEIL_DIV(C, 32), kg0 + 31 in day 11's scalar path): they must not pass INT32_MAX.
MAX_GEMM_K = INT32_MAX - 31


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


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
    """What both day-09 kernels (and day 11's) take: groups = 1 (any stride, padding, dilation,
    filter, C, K), within their 32-bit index arithmetic (`int32_reason`)."""
    if p.groups != 1:
        return f"needs groups=1; got {p.groups} (use `general` or `depthwise`, NCHW)"
    return int32_reason(p)


def int32_reason(p: Conv2dProblem) -> str | None:
    """The implicit-GEMM kernels' (days 09-11) 32-bit arithmetic: GEMM-K = R*S*C at most
    `MAX_GEMM_K` (filter offsets and the GEMM-K walk), and P*Q < 2^31 (each thread decodes its
    output pixel as ``int pq = m % (P*Q)``). None, or the reason."""
    if p.R * p.S * p.C > MAX_GEMM_K:
        return (
            f"GEMM-K = R*S*C = {p.R * p.S * p.C} is over {MAX_GEMM_K}, the kernels' 32-bit filter offsets "
            "and GEMM-K loop"
        )
    if p.P * p.Q > INT32_MAX:
        return f"P*Q = {p.P * p.Q} output pixels per image do not fit the kernels' 32-bit pixel index"
    return None


def blocks(p: Conv2dProblem, t: Tile) -> int:
    """Blocks of one launch with tile ``t``: ceil(GEMM-M / BM) * ceil(GEMM-N / BN)."""
    return _cdiv(p.gemm.m, t.bm) * _cdiv(p.K, t.bn)


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
    """16-byte loads when C % 4 == 0 (4 consecutive channels of a pixel are one aligned float4)."""
    return p.C % 4 == 0


def _entry(p: Conv2dProblem, tile_rule) -> str:
    t = tile_rule(p)
    return f"conv2d_igemm_simt_{t.bm}x{t.bn}_{'vec' if vec_path(p) else 'scalar'}"


def _launch(p: Conv2dProblem, tile_rule) -> LaunchConfig:
    t = tile_rule(p)
    return LaunchConfig(grid=(_cdiv(p.gemm.m, t.bm), _cdiv(p.K, t.bn), 1), block=(THREADS, 1, 1))


def _covers(p: Conv2dProblem, cfg: LaunchConfig, tile_rule) -> np.ndarray:
    """Writes per element of Y[m][k] (the NHWC output, flat): block (bx, by) stores rows
    bx*BM .. +BM-1 (< M) and columns by*BN .. +BN-1 (< K), each once."""
    t = tile_rule(p)
    rows = np.zeros(p.gemm.m, dtype=np.int64)
    for bx in range(cfg.grid[0]):
        rows[bx * t.bm : (bx + 1) * t.bm] += 1
    cols = np.zeros(p.K, dtype=np.int64)
    for by in range(cfg.grid[1]):
        cols[by * t.bn : (by + 1) * t.bn] += 1
    return (rows[:, None] * cols[None, :]).ravel()


def igemm_pointer_check(p: Conv2dProblem, x, w, y) -> str | None:
    """The vector entries' alignment: x and w 16-byte aligned when C % 4 == 0, y (if given) when
    K % 4 == 0. Returns None or the reason (`helpers.variants.prepare` raises it as ValueError)."""
    need = [("x", x), ("w", w)] if vec_path(p) else []
    if p.K % 4 == 0 and y is not None:
        need.append(("y", y))
    for nm, t in need:
        if t.data_ptr() % VEC_ALIGN:
            return (
                f"{nm}.data_ptr() is not {VEC_ALIGN}-byte aligned (a view with a storage offset?); the 16-byte "
                f"loads/stores need it: pass {nm}.clone()"
            )
    return None


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
        entry="conv2d_igemm_simt_128x128_vec",
        entry_fn=partial(_entry, tile_rule=tile_rule),
        summary="implicit GEMM, CUDA cores: up to 128x128 tiles, 8x8 per thread, float4 loads, double buffering",
        supports_fn=igemm_supports,
        launch_fn=partial(_launch, tile_rule=tile_rule),
        args_fn=full_args,
        covers_fn=partial(_covers, tile_rule=tile_rule),
        layouts=("NHWC",),
        tensor_check_fn=igemm_pointer_check,
    )


register(
    Variant(
        name="igemm_simt_analytic",
        day=9,
        cu_file="09_igemm_simt_analytic.cu",
        entry="conv2d_igemm_simt_analytic",
        summary="implicit GEMM, CUDA cores, readable: 64x64 tile, 4x4 per thread, index divisions per load",
        supports_fn=igemm_supports,
        launch_fn=partial(_launch, tile_rule=lambda p: Tile(*ANALYTIC_TILE)),
        args_fn=full_args,
        covers_fn=partial(_covers, tile_rule=lambda p: Tile(*ANALYTIC_TILE)),
        layouts=("NHWC",),
    )
)
register(make_igemm())
