"""Registry entry for day 10: implicit GEMM on tensor cores through the WMMA API.

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
import torch

from .general import full_args
from .igemm import int32_reason
from .problem import Conv2dProblem
from .variants import LaunchConfig, Variant, register

THREADS = 256  # 8 warps, 2 (M) x 4 (N)
BM, BN, BK = 128, 128, 32  # block tile (pixels x channels) and GEMM-K per step
WM, WN = 64, 32  # warp tile: 4 x 2 fragments of 16 x 16
FRAG = 16  # wmma m16n16k16
PAD = 8  # elements of padding per shared row
SHARED_BYTES = 2 * (BM + BN) * (BK + PAD) * 2  # two stages of 16-bit values, static (40,960 B)
VEC_ALIGN = 16  # bytes: the 16-byte (8-channel) loads and stores
VEC_CHANNELS = 8  # 16-bit elements per 16-byte access
MIN_CC = (8, 0)  # bf16 WMMA (and this series' tensor-core days) need sm_80+
DTYPE_NAMES = {"fp16": "fp16", "bf16": "bf16"}


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def wmma_supports(p: Conv2dProblem) -> str | None:
    """What ``igemm_wmma`` takes beyond dtype and layout: groups = 1, and R·S·C and P·Q within the
    kernel's 32-bit arithmetic (`helpers.igemm.int32_reason`). Any stride, padding, dilation,
    filter size, C and K."""
    if p.groups != 1:
        return f"needs groups=1; got {p.groups} (use `general` or `depthwise`, fp32 NCHW)"
    return int32_reason(p)


def vec_path(p: Conv2dProblem) -> bool:
    """16-byte loads when C % 8 == 0: 8 consecutive channels of a pixel (or filter) are one
    aligned 16-byte chunk. Otherwise a chunk could straddle two pixels: scalar loads."""
    return p.C % VEC_CHANNELS == 0


def vec_store(p: Conv2dProblem) -> bool:
    """16-byte stores of y when K % 8 == 0 (8 consecutive output channels of a pixel)."""
    return p.K % VEC_CHANNELS == 0


def wmma_entry(p: Conv2dProblem) -> str:
    """``conv2d_igemm_wmma_<fp16|bf16>_<vec|scalar>`` for ``p``.

    Raises:
        ValueError: a dtype without an entry point (fp32, fp64).
    """
    if p.dtype not in DTYPE_NAMES:
        raise ValueError(f"igemm_wmma has entries for {'/'.join(DTYPE_NAMES)} only; got {p.dtype}")
    return f"conv2d_igemm_wmma_{DTYPE_NAMES[p.dtype]}_{'vec' if vec_path(p) else 'scalar'}"


def wmma_launch(p: Conv2dProblem) -> LaunchConfig:
    """Grid (ceil(N·P·Q / 128), ceil(K / 128), 1) of 256-thread blocks; the 40 KB of shared
    memory are static (no dynamic shared memory)."""
    return LaunchConfig(grid=(_cdiv(p.gemm.m, BM), _cdiv(p.K, BN), 1), block=(THREADS, 1, 1))


def wmma_covers(p: Conv2dProblem, cfg: LaunchConfig) -> np.ndarray:
    """Writes per element of Y[m][k] (the NHWC output, flat), from the kernel's epilogue mapping.

    Block (bx, by), warp (wm, wn) = (warp / 4, warp % 4), fragment row i < 4, pass part < 2,
    lane < 32: row m = bx·128 + 64·wm + 16·i + lane / 4 + 8·part, channels k = by·128 + 32·wn +
    8·(lane % 4) + (0..7); stored where m < M and k < K. Rows and columns are independent, so
    the count is (writes per row) x (writes per column).
    """
    M, K = p.gemm.m, p.K
    wm, i, part, lr = np.ogrid[: BM // WM, : WM // FRAG, :2, :8]
    row_offs = (WM * wm + FRAG * i + lr + 8 * part).ravel()  # the 128 rows of a block, as stored
    m = (np.arange(cfg.grid[0])[:, None] * BM + row_offs[None, :]).ravel()
    rows = np.bincount(m[m < M], minlength=M)
    wn, lc, e = np.ogrid[: BN // WN, :4, :8]
    col_offs = (WN * wn + 8 * lc + e).ravel()  # the 128 channels of a block, as stored
    k = (np.arange(cfg.grid[1])[:, None] * BN + col_offs[None, :]).ravel()
    cols = np.bincount(k[k < K], minlength=K)
    return (rows[:, None] * cols[None, :]).ravel()


def _capability(device: torch.device) -> tuple[int, int] | None:
    """Compute capability of a CUDA tensor's device; None for other devices."""
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_capability(device)


def wmma_tensor_check(p: Conv2dProblem, x, w, y) -> str | None:
    """What the tensors themselves must satisfy; None, or the reason (`helpers.variants.prepare`
    raises it as ValueError before any launch).

    * the GPU must be sm_80 or newer (bf16 fragments, and the series' tensor-core baseline);
    * the ``vec`` entries (C % 8 == 0) read x and w in 16-byte chunks: both 16-byte aligned;
    * the 16-byte stores (K % 8 == 0) need y 16-byte aligned (y is None when `prepare`
      allocates it, and torch's allocations are aligned).
    """
    cc = _capability(x.device)
    if cc is not None and tuple(cc) < MIN_CC:
        return (
            f"needs a GPU of compute capability {MIN_CC[0]}.{MIN_CC[1]} or newer (sm_80+: bf16 WMMA, fp32 "
            f"accumulation on tensor cores); {x.device} is sm_{cc[0]}{cc[1]}"
        )
    need = [("x", x), ("w", w)] if vec_path(p) else []
    if vec_store(p) and y is not None:
        need.append(("y", y))
    for nm, t in need:
        if t.data_ptr() % VEC_ALIGN:
            why = "16-byte loads (C % 8 == 0)" if nm != "y" else "16-byte stores (K % 8 == 0)"
            return (
                f"{nm}.data_ptr() is not {VEC_ALIGN}-byte aligned (a view with a storage offset?); the {why} "
                f"need it: pass {nm}.clone()"
            )
    return None


IGEMM_WMMA = register(
    Variant(
        name="igemm_wmma",
        day=10,
        cu_file="10_igemm_wmma.cu",
        entry="conv2d_igemm_wmma_fp16_vec",
        entry_fn=wmma_entry,
        summary="implicit GEMM on tensor cores (WMMA 16x16x16): fp16/bf16 in, fp32 accumulate, 128x128 tile",
        supports_fn=wmma_supports,
        launch_fn=wmma_launch,
        args_fn=full_args,
        covers_fn=wmma_covers,
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=wmma_tensor_check,
    )
)
