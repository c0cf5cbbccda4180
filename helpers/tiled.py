"""Registry entries for the shared-memory tile days (03 shared, 04 shared_halo, 05 accumulators).

All of them compute one TILE x TILE square of output pixels per block, for one (image, output
channel) plane picked by blockIdx.z, and loop over row tiles (blockIdx.y) and planes
(blockIdx.z) with block-uniform grid-stride loops, so grids are capped at 65,535 in y and z.

Each entry has a Python model of its kernel's thread -> output mapping (``covers``), written from
the ``.cu`` file's header comment: per grid axis it lists the tiles the blocks visit and the
output offsets the computing threads of a tile write, and counts the writes to every output
element. The axes are independent, so the counts multiply.

`with_grid_cap` makes an unregistered copy of a variant whose grid is capped lower, to exercise
the grid-stride loops with small problems on a GPU.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from .direct import _cdiv, _grid_stride, nchw_args, same_fp32_nchw
from .problem import Conv2dProblem
from .variants import MAX_GRID, MAX_THREADS_PER_BLOCK, LaunchConfig, Variant, register

TILE = 16  # output tile side for days 03-05; passed to the kernels as -DTILE


def _axis_writes(n_out: int, tile_visits: np.ndarray, tile: int, offsets) -> np.ndarray:
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


def _tile_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: int, cols_of_threads, rows_of_threads) -> np.ndarray:
    """Writes per output element (flat NCHW) for the day 03-05 grid loops.

    x: block b processes column tile b (no loop); y: block b processes row tiles b, b + gridDim.y,
    ... below ceil(P / tile); z: block b processes planes n*K + k = b, b + gridDim.z, ... below N*K.
    """
    cols = _axis_writes(p.Q, np.ones(cfg.grid[0], dtype=np.int64), tile, cols_of_threads)
    rows = _axis_writes(p.P, _grid_stride(_cdiv(p.P, tile), 1, cfg.grid[1]), tile, rows_of_threads)
    planes = _grid_stride(p.N * p.K, 1, cfg.grid[2])
    return (planes.reshape(-1, 1, 1) * rows.reshape(1, -1, 1) * cols.reshape(1, 1, -1)).ravel()


def _tile_grid(p: Conv2dProblem, tile: int) -> tuple[int, int, int]:
    """(ceil(Q / tile), min(ceil(P / tile), 65535), min(N*K, 65535))."""
    return (_cdiv(p.Q, tile), min(_cdiv(p.P, tile), MAX_GRID[1]), min(p.N * p.K, MAX_GRID[2]))


def _window_bytes(p: Conv2dProblem, tile: int) -> int:
    """Shared bytes of the tile plus halo: (tile + R - 1) * (tile + S - 1) floats."""
    return (tile + p.R - 1) * (tile + p.S - 1) * 4


# ---- day 03: shared (output tile in shared memory, halo from global) ---------------------------


def shared_launch(p: Conv2dProblem, tile: int = TILE) -> LaunchConfig:
    """Block (tile, tile); the tile is a static ``__shared__`` array, so no dynamic bytes."""
    return LaunchConfig(grid=_tile_grid(p, tile), block=(tile, tile, 1))


def one_thread_per_output_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: int = TILE) -> np.ndarray:
    """Days 03, 04 (b), 05: thread (tx, ty) writes (tile_y * tile + ty, blockIdx.x * tile + tx)."""
    return _tile_covers(p, cfg, tile, np.arange(cfg.block[0]), np.arange(cfg.block[1]))


register(
    Variant(
        name="shared",
        day=3,
        cu_file="03_shared.cu",
        entry="conv2d_shared",
        summary="the block's TILE x TILE input tile in shared memory, one channel at a time; "
        "halo taps read from global memory",
        supports_fn=same_fp32_nchw,
        launch_fn=shared_launch,
        args_fn=nchw_args,
        covers_fn=one_thread_per_output_covers,
        defines={"TILE": TILE},
    )
)


# ---- day 04 (a): shared_halo_threads (one thread per input pixel of tile + halo) ---------------


def halo_threads_supports(p: Conv2dProblem, tile: int = TILE) -> str | None:
    """Same conv, and a (tile + S - 1) x (tile + R - 1) block of at most 1024 threads."""
    reason = same_fp32_nchw(p)
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
        grid=_tile_grid(p, tile), block=(tile + p.S - 1, tile + p.R - 1, 1), shared_bytes=_window_bytes(p, tile)
    )


def halo_threads_covers(p: Conv2dProblem, cfg: LaunchConfig, tile: int = TILE) -> np.ndarray:
    """Thread (tx, ty) loads input (tile_y*tile - pad_h + ty, bx*tile - pad_w + tx); the threads with
    pad_w <= tx < pad_w + tile and pad_h <= ty < pad_h + tile write that same pixel of y."""
    pad_h, pad_w = p.padding
    cols = [tx - pad_w for tx in range(cfg.block[0]) if pad_w <= tx < pad_w + tile]
    rows = [ty - pad_h for ty in range(cfg.block[1]) if pad_h <= ty < pad_h + tile]
    return _tile_covers(p, cfg, tile, cols, rows)


register(
    Variant(
        name="shared_halo_threads",
        day=4,
        cu_file="04_shared_halo_threads.cu",
        entry="conv2d_shared_halo_threads",
        summary="tile plus halo in shared memory; one thread per window pixel loads it, "
        "the inner TILE x TILE threads compute",
        supports_fn=halo_threads_supports,
        launch_fn=halo_threads_launch,
        args_fn=nchw_args,
        covers_fn=halo_threads_covers,
        defines={"TILE": TILE},
    )
)


# ---- day 04 (b): shared_halo_strided (output-sized block, strided cooperative load) -----------


def halo_strided_launch(p: Conv2dProblem, tile: int = TILE) -> LaunchConfig:
    """Block (tile, tile); dynamic shared memory for the (tile + R - 1) x (tile + S - 1) window.

    Filters whose window exceeds the device's shared memory are refused by `Variant.supports`.
    """
    return LaunchConfig(grid=_tile_grid(p, tile), block=(tile, tile, 1), shared_bytes=_window_bytes(p, tile))


register(
    Variant(
        name="shared_halo_strided",
        day=4,
        cu_file="04_shared_halo_strided.cu",
        entry="conv2d_shared_halo_strided",
        summary="tile plus halo in shared memory, loaded by the TILE x TILE output threads "
        "in a strided cooperative loop; every thread computes",
        supports_fn=same_fp32_nchw,
        launch_fn=halo_strided_launch,
        args_fn=nchw_args,
        covers_fn=one_thread_per_output_covers,
        defines={"TILE": TILE},
    )
)


# ---- day 05: accumulators (day 04 (b) with float / double / Kahan sums) -----------------------

for _name, _mode, _accum, _what in (
    ("acc_float", "ACCUM_FLOAT", "fp32", "fp32 sum (the same code as shared_halo_strided)"),
    ("acc_double", "ACCUM_DOUBLE", "fp64", "products and sum in fp64, rounded to fp32 once"),
    ("acc_kahan", "ACCUM_KAHAN", "fp32", "compensated (Kahan) fp32 sum"),
):
    register(
        Variant(
            name=_name,
            day=5,
            cu_file="05_accumulators.cu",
            entry="conv2d_accumulators",
            summary=f"shared_halo_strided with a {_what}",
            supports_fn=same_fp32_nchw,
            launch_fn=halo_strided_launch,
            args_fn=nchw_args,
            covers_fn=one_thread_per_output_covers,
            defines={"TILE": TILE, "ACCUM_MODE": _mode},
            # Kahan's error (about 2u per term plus O(n u^2)) is within the fp32 bound gamma_n.
            accum=_accum,
        )
    )


# ---- testing aid -------------------------------------------------------------------------------


def with_grid_cap(v: Variant, max_y: int, max_z: int) -> Variant:
    """An unregistered copy of ``v`` whose grid is capped at ``max_y`` blocks in y and ``max_z`` in z.

    Every kernel of days 01-05 walks y and z with grid-stride loops, so any cap >= 1 must give the
    same output; small caps exercise those loops on problems small enough to check quickly
    (`helpers.variants.run` and `helpers.check.check` accept the returned `Variant`).
    """
    launch: Callable[[Conv2dProblem], LaunchConfig] = v.launch_fn

    def capped(p: Conv2dProblem) -> LaunchConfig:
        cfg = launch(p)
        gx, gy, gz = cfg.grid
        return dataclasses.replace(cfg, grid=(gx, min(gy, max_y), min(gz, max_z)))

    return dataclasses.replace(v, name=f"{v.name}_cap{max_y}x{max_z}", launch_fn=capped)
