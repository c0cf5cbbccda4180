"""Day 13: ``igemm_production``, the production tensor-core implicit GEMM.

``kernels/conv2d/igemm_mainloop.cuh`` (instantiated by ``13_igemm_production.cu``) is day 12's
kernel (day 11's mma.sync m16n8k16, ldmatrix, XOR-swizzled shared memory, fp32 accumulation,
NHWC fp16/bf16, fed by a cp.async ring of stages) grown into a production kernel: fragment double
buffering in the main loop and four additions, each a parameter here. This package splits them by concern:

* `tiles` — **tile descriptions** (`TileDescription`): block tile BM x BN x BK, WGM x WGN warps,
  pipeline stages, instruction shape; `TileDescription.reason` refuses an invalid one with the
  reason (e.g. a warp tile that is not a multiple of the 16 x 8 instruction, more shared memory
  than a block may have, or a description the ``.cu`` file does not instantiate), and
  `INSTANTIATED` is read from the ``.cu`` file;
* `rule` — the choices per problem: **input iterators** (`ITERATORS`: ``optimized`` for C % 8 == 0
  and R, S <= 16, 16-byte cp.async, per-row offsets and tap masks precomputed; ``analytic`` for
  any C, every element decoded with divisions; ``few_channels`` for C <= 8, GEMM-K packed across
  taps), the **tile rule** (`choose_tile`) and the **threadblock swizzle** (log2 of the filter
  tiles visited by consecutive blocks); `choose` picks all three;
* `variant` — the launch, the refusals, the coverage model and the **fused epilogue**
  D = act(alpha·conv(x, w) + beta·Cin + bias), act = identity or ReLU: ``cin``, ``bias`` and a
  `helpers.epilogue.Epilogue` go through `helpers.launch.prepare` by name;
  `make_production` builds a variant with any choice forced, and the registered
  ``igemm_production`` is the automatic one.

Sources: the PTX ISA ("cp.async", "cp.async.wait_group", "mma.sync m16n8k16", "ldmatrix");
NVIDIA CUTLASS, ``docs/implicit_gemm_convolution.md`` (analytic / optimized / few-channels
iterators, threadblock swizzle ``GemmIdentityThreadblockSwizzle``, ``LinearCombinationRelu``
epilogue) and ``docs/efficient_gemm.md`` (software pipelining through shared memory).
"""

from . import space  # noqa: F401 - registers day 15's search space for igemm_production
from .rule import (
    FEW_CHANNELS_MAX_C,
    ITERATORS,
    MAX_MASKED_TAPS,
    MIN_BLOCKS,
    ProductionConfig,
    blocks,
    choose,
    choose_iterator,
    choose_swizzle,
    choose_tile,
    iterator_reason,
)
from .tiles import (
    CU_FILE,
    INSTANTIATED,
    INSTRUCTION,
    MAINLOOP,
    MAX_SMEM_PER_BLOCK,
    TILES,
    TileDescription,
    read_entries,
    tiles_for,
    tune_defines,
)
from .variant import config_reason, covers, int32_walk_reason, make_production, production_launches, tensor_check

__all__ = [
    "CU_FILE", "FEW_CHANNELS_MAX_C", "INSTANTIATED", "INSTRUCTION", "ITERATORS", "MAINLOOP", "MAX_MASKED_TAPS",
    "MAX_SMEM_PER_BLOCK", "MIN_BLOCKS", "TILES", "ProductionConfig", "TileDescription", "blocks", "choose",
    "choose_iterator", "choose_swizzle", "choose_tile", "config_reason", "covers", "int32_walk_reason",
    "iterator_reason", "make_production", "production_launches", "read_entries", "tensor_check", "tiles_for",
    "tune_defines",
]
