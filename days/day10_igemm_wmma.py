"""Day 10: implicit GEMM on tensor cores through the WMMA API.

``igemm_wmma`` (``kernels/conv2d/10_igemm_wmma.cu``) takes fp16 or bf16 NHWC tensors (x, w and y
all of one dtype), accumulates in fp32 and rounds once when it writes y. It keeps day 09's GEMM
view (GEMM-M = N·P·Q pixels, GEMM-N = K channels, GEMM-K = R·S·C, walked tap by tap) and moves
the products onto tensor cores: a 128 x 128 block tile, 8 warps of 64 x 32, each a 4 x 2 grid
of 16 x 16 x 16 ``wmma`` fragments with float accumulators, BK = 32 channels per step, shared
rows padded by 8 elements against bank conflicts, two shared-memory stages.

Entry points, one per element type and load path: ``conv2d_igemm_wmma_<fp16|bf16>_<vec|scalar>``.
The ``vec`` entries load 8 channels (16 bytes) at once and need C % 8 == 0 and 16-byte aligned
x and w; the ``scalar`` entries load element by element and take any C. y is written with
16-byte stores when K % 8 == 0 (y must then be 16-byte aligned), element by element otherwise.

Sources: NVIDIA, *CUDA C++ Programming Guide*, "Warp Matrix Functions" (the ``nvcuda::wmma``
API: fragments, ``load_matrix_sync``, ``mma_sync``, ``store_matrix_sync``, ``ldm``); NVIDIA
CUTLASS, ``docs/implicit_gemm_convolution.md`` (the implicit-GEMM mapping of fprop).
"""

from __future__ import annotations

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import LaunchConfig, Variant, register

from .day09_igemm_simt import igemm_supports, vec_path
from .kit import (
    FULL_SIZES,
    TENSOR_CORE_CC,
    VEC_BYTES,
    alignment_reason,
    cdiv,
    chunks16,
    gemm_tile_launch,
    gemm_writes,
    single_kernel,
    tile_visits,
)

THREADS = 256  # 8 warps, 2 (M) x 4 (N)
BM, BN, BK = 128, 128, 32  # block tile (pixels x channels) and GEMM-K per step
WM, WN = 64, 32  # warp tile: 4 x 2 fragments of 16 x 16
FRAG = 16  # wmma m16n16k16
PAD = 8  # elements of padding per shared row
SHARED_BYTES = 2 * (BM + BN) * (BK + PAD) * 2  # two stages of 16-bit values, static (40,960 B)


def vec_store(p: Conv2dProblem) -> bool:
    """16-byte stores of y when K % 8 == 0 (8 consecutive output channels of a pixel)."""
    return chunks16(p.K, p)


def wmma_entry(p: Conv2dProblem) -> str:
    """``conv2d_igemm_wmma_<fp16|bf16>_<vec|scalar>`` for ``p``.

    Raises:
        ValueError: a dtype without an entry point (fp32, fp64).
    """
    if p.dtype not in ("fp16", "bf16"):
        raise ValueError(f"igemm_wmma has entries for fp16/bf16 only; got {p.dtype}")
    return f"conv2d_igemm_wmma_{p.dtype}_{'vec' if vec_path(p) else 'scalar'}"


def wmma_launch(p: Conv2dProblem) -> LaunchConfig:
    """Grid (ceil(N·P·Q / 128), ceil(K / 128), 1) of 256-thread blocks; the 40 KB of shared
    memory are static (no dynamic shared memory)."""
    return gemm_tile_launch(p, BM, BN, THREADS)


def wmma_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    """Writes per element of Y[m][k] (the NHWC output, flat), from the kernel's epilogue mapping.

    Block (bx, by), warp (wm, wn) = (warp / 4, warp % 4), fragment row i < 4, pass part < 2,
    lane < 32: row m = bx·128 + 64·wm + 16·i + lane / 4 + 8·part, channels k = by·128 + 32·wn +
    8·(lane % 4) + (0..7); stored where m < M and k < K. Rows and columns are independent, so
    the count is (writes per row) x (writes per column).
    """
    wm, i, part, lr = np.ogrid[: BM // WM, : WM // FRAG, :2, :8]
    row_offs = (WM * wm + FRAG * i + lr + 8 * part).ravel()  # the 128 rows of a block, as stored
    wn, lc, e = np.ogrid[: BN // WN, :4, :8]
    col_offs = (WN * wn + 8 * lc + e).ravel()  # the 128 channels of a block, as stored
    visits = tile_visits(cfg.grid, cdiv(p.gemm.m, BM), cdiv(p.K, BN))
    return gemm_writes(p.gemm.m, p.K, BM, BN, visits, np.bincount(row_offs, minlength=BM),
                       np.bincount(col_offs, minlength=BN))


def wmma_tensor_check(p: Conv2dProblem, tensors: dict, epilogue=None) -> str | None:
    """What the tensors themselves must satisfy; None, or the reason (`helpers.launch.prepare`
    raises it as ValueError before any launch).

    * the ``vec`` entries (C % 8 == 0) read x and w in 16-byte chunks: both 16-byte aligned;
    * the 16-byte stores (K % 8 == 0) need y 16-byte aligned (y is None when `prepare`
      allocates it, and torch's allocations are aligned).
    """
    need = {"x": VEC_BYTES, "w": VEC_BYTES} if vec_path(p) else {}
    reason = alignment_reason(tensors, need, "the 16-byte loads (C % 8 == 0)")
    if reason is None and vec_store(p):
        reason = alignment_reason(tensors, {"y": VEC_BYTES}, "the 16-byte stores (K % 8 == 0)")
    return reason


register(
    Variant(
        name="igemm_wmma",
        day=10,
        cu_file="10_igemm_wmma.cu",
        summary="implicit GEMM on tensor cores (WMMA 16x16x16): fp16/bf16 in, fp32 accumulate, 128x128 tile",
        supports_fn=igemm_supports,
        launches_fn=single_kernel(wmma_entry, wmma_launch, f"x w y {FULL_SIZES} groups"),
        covers_fn=wmma_covers,
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=wmma_tensor_check,
        min_cc=TENSOR_CORE_CC,
        min_cc_why="bf16 WMMA fragments, fp32 accumulation on tensor cores",
    )
)
