"""Day 11: tensor-core implicit GEMM with mma.sync, NHWC fp16/bf16.

* ``igemm_mma`` (``kernels/conv2d/11_igemm_mma.cu``): ``mma.sync.m16n8k16`` through inline PTX,
  ``ldmatrix.x4``, XOR-swizzled shared memory, 128 x 128 x 32 block tile, 8 warps of 64 x 32,
  register-staged double buffering; a 16-byte "vec" load path for C % 8 == 0 and an analytic
  scalar path for any C.

fp32 accumulation, output in the input dtype (what torch/cuDNN do for fp16/bf16 convolutions).
Day 09's GEMM view, problem claim and tile coverage (`days.day09_igemm_simt`) carry over.
The instruction shapes and fragment layouts follow the PTX ISA ("Warp-level matrix multiply-
accumulate instructions", m16n8k16; "ldmatrix"); the swizzle and tiling follow CUTLASS's
implicit GEMM convolution (docs/implicit_gemm_convolution.md).
"""

from __future__ import annotations

from helpers.problem import Conv2dProblem
from helpers.variants import LaunchConfig, Variant, register

from .day09_igemm_simt import Tile, igemm_supports, tile_covers, vec_path
from .kit import (
    FULL_SIZES,
    TENSOR_CORE_CC,
    VEC_BYTES,
    alignment_reason,
    cdiv,
    gemm_tile_launch,
    input_reach_reason,
    single_kernel,
)

MMA_TILE = (128, 128)  # BM x BN of 11_igemm_mma.cu
KB = 32  # GEMM-K per step
MMA_THREADS = 256


def _mma_entry(p: Conv2dProblem) -> str:
    return f"conv2d_igemm_mma_{p.dtype}_{'vec' if vec_path(p) else 'scalar'}"


def _mma_launch(p: Conv2dProblem) -> LaunchConfig:
    return gemm_tile_launch(p, *MMA_TILE, MMA_THREADS)


def mma_supports(p: Conv2dProblem) -> str | None:
    """Day 09's claim (`days.day09_igemm_simt.igemm_supports`). The scalar path (C % 8 != 0) walks
    GEMM-K in flat steps of 32 and decodes rr = kg / (S*C) for every lane of the last step, past
    GEMM-K too (those loads are masked), then forms h0 + rr*dh: the input rows are checked up to
    that rr. None, or the reason."""
    reason = igemm_supports(p)
    if reason or vec_path(p):
        return reason
    kg_last = cdiv(p.R * p.S * p.C, KB) * KB - 1  # the last step's last lane, kg0 + 8*3 + 7
    return input_reach_reason(p, taps_r=kg_last // (p.S * p.C) + 1)


def tensor_core_check(p: Conv2dProblem, tensors: dict, epilogue=None) -> str | None:
    """What the kernel needs of the tensors: x and w 16-byte aligned on the vec path (C % 8 == 0),
    y 4-byte aligned where K is even (the kernel stores pairs of outputs then, single ones for odd
    K). Returns None or the reason (`helpers.launch.prepare` raises it as ValueError)."""
    need = {"x": VEC_BYTES, "w": VEC_BYTES} if vec_path(p) else {}
    if p.K % 2 == 0:
        need["y"] = 4
    return alignment_reason(tensors, need, "the vector loads and paired stores")


register(
    Variant(
        name="igemm_mma",
        day=11,
        cu_file="11_igemm_mma.cu",
        summary="tensor cores: mma.sync m16n8k16 + ldmatrix, swizzled smem, 128x128x32 tile, register double buffering",
        supports_fn=mma_supports,
        launches_fn=single_kernel(_mma_entry, _mma_launch, f"x w y {FULL_SIZES} groups"),
        covers_fn=lambda p, cfg: tile_covers(p, cfg, Tile(*MMA_TILE)),
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=tensor_core_check,
        min_cc=TENSOR_CORE_CC,
        min_cc_why="mma.sync m16n8k16 with bf16, ldmatrix",
    )
)
