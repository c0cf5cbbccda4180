"""Day 04: the tile plus its halo in shared memory, two ways (day 03's tiling, `days.day03_shared`).

* ``shared_halo_threads`` (``04_shared_halo_threads.cu``): one thread per input pixel of the
  (TILE + R - 1) x (TILE + S - 1) window loads it; the inner TILE x TILE threads compute;
* ``shared_halo_strided`` (``04_shared_halo_strided.cu``): an output-sized block loads the
  window in a strided cooperative loop; every thread computes.
"""

from __future__ import annotations

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.variants import MAX_THREADS_PER_BLOCK, LaunchConfig, Variant, register

from .day03_shared import TILE, one_thread_per_output_covers, tile_grid, tile_writes, tiled_int32_reason, window_bytes
from .kit import NCHW_SIZES, same_conv_reason, single_kernel

# ---- (a) shared_halo_threads: one thread per input pixel of tile + halo ------------------------


def halo_threads_supports(p: Conv2dProblem, tile: int = TILE) -> str | None:
    """Same conv within the tiling's 32-bit ints (`days.day03_shared.tiled_int32_reason`), and a
    (tile + S - 1) x (tile + R - 1) block of at most 1024 threads."""
    reason = same_conv_reason(p) or tiled_int32_reason(p, tile)
    if reason:
        return reason
    bx, by = tile + p.S - 1, tile + p.R - 1
    if bx * by > MAX_THREADS_PER_BLOCK:
        return (
            f"needs one thread per pixel of the (TILE+R-1) x (TILE+S-1) window, at most "
            f"{MAX_THREADS_PER_BLOCK} (R, S <= {int(MAX_THREADS_PER_BLOCK**0.5) - tile + 1} for a square filter "
            f"at TILE={tile}); got R={p.R}, S={p.S}: {by} x {bx} = {bx * by} threads"
        )
    return None


def halo_threads_launch(p: Conv2dProblem, tile: int = TILE) -> LaunchConfig:
    """Block (tile + S - 1, tile + R - 1): its shape follows the runtime filter size."""
    return LaunchConfig(
        grid=tile_grid(p, tile), block=(tile + p.S - 1, tile + p.R - 1, 1), shared_bytes=window_bytes(p, tile)
    )


def halo_threads_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: int = TILE) -> np.ndarray:
    """Thread (tx, ty) loads input (tile_y*tile - pad_h + ty, bx*tile - pad_w + tx); the threads with
    pad_w <= tx < pad_w + tile and pad_h <= ty < pad_h + tile write that same pixel of y."""
    pad_h, pad_w = p.padding
    cols = [tx - pad_w for tx in range(cfg.block[0]) if pad_w <= tx < pad_w + tile]
    rows = [ty - pad_h for ty in range(cfg.block[1]) if pad_h <= ty < pad_h + tile]
    return tile_writes(p, cfg, tile, cols, rows)


register(
    Variant(
        name="shared_halo_threads",
        day=4,
        cu_file="04_shared_halo_threads.cu",
        summary="tile plus halo in shared memory; one thread per window pixel loads it, "
        "the inner TILE x TILE threads compute",
        supports_fn=halo_threads_supports,
        launches_fn=single_kernel("conv2d_shared_halo_threads", halo_threads_launch, f"x w y {NCHW_SIZES}"),
        covers_fn=halo_threads_covers,
        defines={"TILE": TILE},
    )
)


# ---- (b) shared_halo_strided: output-sized block, strided cooperative load ---------------------


def halo_strided_supports(p: Conv2dProblem, tile: int = TILE) -> str | None:
    """Same conv within the tiling's 32-bit ints (`days.day03_shared.tiled_int32_reason`); the
    window's shared memory (whose size also bounds R*S) is checked by `Variant.supports`."""
    return same_conv_reason(p) or tiled_int32_reason(p, tile)


def halo_strided_launch(p: Conv2dProblem, tile: int = TILE) -> LaunchConfig:
    """Block (tile, tile); dynamic shared memory for the (tile + R - 1) x (tile + S - 1) window.

    Filters whose window exceeds the device's shared memory are refused by `Variant.supports`.
    """
    return LaunchConfig(grid=tile_grid(p, tile), block=(tile, tile, 1), shared_bytes=window_bytes(p, tile))


register(
    Variant(
        name="shared_halo_strided",
        day=4,
        cu_file="04_shared_halo_strided.cu",
        summary="tile plus halo in shared memory, loaded by the TILE x TILE output threads "
        "in a strided cooperative loop; every thread computes",
        supports_fn=halo_strided_supports,
        launches_fn=single_kernel("conv2d_shared_halo_strided", halo_strided_launch, f"x w y {NCHW_SIZES}"),
        covers_fn=one_thread_per_output_covers,
        defines={"TILE": TILE},
    )
)
