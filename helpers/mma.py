"""Registry entry for day 11: tensor-core implicit GEMM with mma.sync, NHWC fp16/bf16.

* ``igemm_mma`` (``kernels/conv2d/11_igemm_mma.cu``): ``mma.sync.m16n8k16`` through inline PTX,
  ``ldmatrix.x4``, XOR-swizzled shared memory, 128 x 128 x 32 block tile, 8 warps of 64 x 32,
  register-staged double buffering; a 16-byte "vec" load path for C % 8 == 0 and an analytic
  scalar path for any C.

fp32 accumulation, output in the input dtype (what torch/cuDNN do for fp16/bf16 convolutions).
The instruction shapes and fragment layouts follow the PTX ISA ("Warp-level matrix multiply-
accumulate instructions", m16n8k16; "ldmatrix"); the swizzle and tiling follow CUTLASS's
implicit GEMM convolution (docs/implicit_gemm_convolution.md).
"""

from __future__ import annotations

from functools import partial

import torch

from .general import full_args
from .igemm import Tile, _covers, igemm_supports
from .problem import Conv2dProblem
from .variants import LaunchConfig, Variant, register

MMA_TILE = (128, 128)  # BM x BN of 11_igemm_mma.cu (BK = 32)
MMA_THREADS = 256
MIN_CC = (8, 0)  # mma.sync m16n8k16 with bf16, ldmatrix: sm_80+


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mma_vec_path(p: Conv2dProblem) -> bool:
    """16-byte loads (8 channels of one pixel or filter row) when C % 8 == 0."""
    return p.C % 8 == 0


def _mma_entry(p: Conv2dProblem) -> str:
    return f"conv2d_igemm_mma_{p.dtype}_{'vec' if mma_vec_path(p) else 'scalar'}"


def _mma_launch(p: Conv2dProblem) -> LaunchConfig:
    bm, bn = MMA_TILE
    return LaunchConfig(grid=(_cdiv(p.gemm.m, bm), _cdiv(p.K, bn), 1), block=(MMA_THREADS, 1, 1))


def tensor_core_check(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None) -> str | None:
    """What the tensor-core kernels need of the tensors: a GPU of compute capability 8.0 or newer,
    x and w 16-byte aligned on the vec path (C % 8 == 0), y 4-byte aligned where K is even (the
    kernel stores pairs of outputs then, single ones for odd K).

    Returns None or the reason (`helpers.variants.prepare` raises it as ValueError).
    """
    if x.is_cuda:
        cc = torch.cuda.get_device_capability(x.device)
        if cc < MIN_CC:
            need_cc = f"{MIN_CC[0]}.{MIN_CC[1]}"
            return f"needs a GPU of compute capability {need_cc}+ (mma.sync, ldmatrix); this one is {cc[0]}.{cc[1]}"
    need = [("x", x, 16), ("w", w, 16)] if mma_vec_path(p) else []
    if y is not None and p.K % 2 == 0:
        need.append(("y", y, 4))
    for nm, t, align in need:
        if t.data_ptr() % align:
            return f"{nm}.data_ptr() is not {align}-byte aligned (a view with a storage offset?): pass {nm}.clone()"
    return None


register(
    Variant(
        name="igemm_mma",
        day=11,
        cu_file="11_igemm_mma.cu",
        entry="conv2d_igemm_mma_fp16_vec",
        entry_fn=_mma_entry,
        summary="tensor cores: mma.sync m16n8k16 + ldmatrix, swizzled smem, 128x128x32 tile, register double buffering",
        supports_fn=igemm_supports,
        launch_fn=_mma_launch,
        args_fn=full_args,
        covers_fn=partial(_covers, tile_rule=lambda p: Tile(*MMA_TILE)),
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=tensor_core_check,
    )
)
