"""Day 03: ``shared``, the block's input tile in shared memory (``kernels/conv2d/03_shared.cu``).

Days 03-05 all compute one TILE x TILE square of output pixels per block, for one (image, output
channel) plane picked by blockIdx.z, and loop over row tiles (blockIdx.y) and planes
(blockIdx.z) with block-uniform grid-stride loops, so grids are capped at 65,535 in y and z.
This module holds that shared tiling (`tile_grid`, `tile_writes`, `window_bytes`) and its
32-bit limits (`tiled_int32_reason`), which days 04 and 05 build on.

The ``covers`` models list, per grid axis, the tiles the blocks visit and the output offsets the
computing threads of a tile write, and count the writes to every output element. The axes are
independent, so the counts multiply.
"""

from __future__ import annotations

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import MAX_GRID, LaunchConfig, Variant, register

from .kit import (
    NCHW_SIZES,
    cdiv,
    ceil_div_reason,
    grid_stride_counts,
    input_reach_reason,
    same_conv_reason,
    single_kernel,
    tap_offset_reason,
)

TILE = 16  # output tile side for days 03-05; passed to the kernels as -DTILE


def axis_writes(n_out: int, tile_visits: np.ndarray, tile: int, offsets) -> np.ndarray:
    """Writes per output index along one axis.

    Args:
        n_out: outputs along the axis (P or Q); the kernels store only indices in ``[0, n_out)``.
        tile_visits: ``tile_visits[t]`` is how many times some block processes tile ``t``.
        tile: outputs per tile (the kernel's TILE: tile ``t`` starts at output ``t * tile``).
        offsets: the output offsets, from the tile's start, that the block's computing threads
            write along this axis (one entry per computing thread index).
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    out = np.arange(len(tile_visits), dtype=np.int64)[:, None] * tile + offsets[None, :]
    visits = np.broadcast_to(np.asarray(tile_visits, dtype=np.int64)[:, None], out.shape)
    keep = (out >= 0) & (out < n_out)
    return np.bincount(out[keep], weights=visits[keep], minlength=n_out).astype(np.int64)


def tile_writes(p: Conv2dProblem, cfg: LaunchConfig, tile: int, cols_of_threads, rows_of_threads) -> np.ndarray:
    """Writes per output element (flat NCHW) for the day 03-05 grid loops.

    x: block b processes column tile b (no loop); y: block b processes row tiles b, b + gridDim.y,
    ... below ceil(P / tile); z: block b processes planes n*K + k = b, b + gridDim.z, ... below N*K.
    """
    cols = axis_writes(p.Q, np.ones(cfg.grid[0], dtype=np.int64), tile, cols_of_threads)
    rows = axis_writes(p.P, grid_stride_counts(cdiv(p.P, tile), 1, cfg.grid[1]), tile, rows_of_threads)
    planes = grid_stride_counts(p.N * p.K, 1, cfg.grid[2])
    return (planes.reshape(-1, 1, 1) * rows.reshape(1, -1, 1) * cols.reshape(1, 1, -1)).ravel()


def tile_grid(p: Conv2dProblem, tile: int) -> tuple[int, int, int]:
    """(ceil(Q / tile), min(ceil(P / tile), 65535), min(N*K, 65535))."""
    return (cdiv(p.Q, tile), min(cdiv(p.P, tile), MAX_GRID[1]), min(p.N * p.K, MAX_GRID[2]))


def window_bytes(p: Conv2dProblem, tile: int) -> int:
    """Shared bytes of the tile plus halo: (tile + R - 1) * (tile + S - 1) floats."""
    return (tile + p.R - 1) * (tile + p.S - 1) * 4


def tiled_int32_reason(p: Conv2dProblem, tile: int = TILE) -> str | None:
    """The 32-bit ints of the day 03-05 tiling: ``tiles_y = CEIL_DIV(H, TILE)`` (H + TILE - 1
    must fit, or the count wraps negative and no row tile runs) and the input coordinates of every
    row and column of the tiles, the last partial tile included (its threads past the image still
    load and compute). None, or the reason."""
    return ceil_div_reason("tiles_y", p.H, tile) or input_reach_reason(
        p, rows=cdiv(p.P, tile) * tile, cols=cdiv(p.Q, tile) * tile
    )


def shared_supports(p: Conv2dProblem, tile: int = TILE) -> str | None:
    """The claim of days 01-06 within `tiled_int32_reason`, and the filter offset r*S + s,
    which this kernel forms for every tap, padding included."""
    return same_conv_reason(p) or tiled_int32_reason(p, tile) or tap_offset_reason(p, every_tap=True)


def shared_launch(p: Conv2dProblem, tile: int = TILE) -> LaunchConfig:
    """Block (tile, tile); the tile is a static ``__shared__`` array, so no dynamic bytes."""
    return LaunchConfig(grid=tile_grid(p, tile), block=(tile, tile, 1))


def one_thread_per_output_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: int = TILE) -> np.ndarray:
    """Days 03, 04 (b), 05: thread (tx, ty) writes (tile_y * tile + ty, blockIdx.x * tile + tx)."""
    return tile_writes(p, cfg, tile, np.arange(cfg.block[0]), np.arange(cfg.block[1]))


register(
    Variant(
        name="shared",
        day=3,
        cu_file="03_shared.cu",
        summary="the block's TILE x TILE input tile in shared memory, one channel at a time; "
        "halo taps read from global memory",
        supports_fn=shared_supports,
        launches_fn=single_kernel("conv2d_shared", shared_launch, f"x w y {NCHW_SIZES}"),
        covers_fn=one_thread_per_output_covers,
        defines={"TILE": TILE},
    )
)
