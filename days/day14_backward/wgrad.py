"""Day 14's wgrad variants (``14_wgrad.cu``): an implicit GEMM M = K, N = C·R·S, GEMM-K = N·P·Q
with split-K, parallel (``wgrad``: fp32 partials in the workspace, then a reduction kernel) or
serial (``wgrad_serial``: the slices of a tile add into one fp32 sum in turn, on a semaphore).

`WgradConfig` is what one run uses (tile, split factor, mode); `choose_wgrad` is the rule
(`choose_tile`: the tile by the output size; `choose_splits`: enough blocks to fill the GPU,
no more partial traffic than a quarter of the main loop, no slice under `MIN_SLICE_STEPS`
steps). `make_wgrad` builds a variant with any of them forced.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache, partial

import numpy as np

from helpers.compile import kernel_path
from helpers.epilogue import Epilogue
from helpers.problem import Conv2dProblem
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from ..kit import TENSOR_CORE_CC, VEC_BYTES, alignment_reason, cdiv, gemm_writes, grid_stride_items, tile_visits
from .model import split_k_slices

CU_FILE = "14_wgrad.cu"
MODES = ("parallel", "serial")
# The rule (`choose_tile`, `choose_splits`), fitted by hand on the H200 (132 SMs) to a sweep of
# six tiles x split factors (1, half, 1x, 2x and 4x the rule's) over the 38 ResNet-50 layers,
# after a first sweep of splits 1..256 on four layers. The tiles: 64 x 64 x 64 for K <= 64 (a
# taller tile would be half empty; 3 stages, 48 KB, which every GPU allows without opt-in);
# 128 x 128 where the layer has the work to feed it (at least BIG_TILE_MIN_FLOPS: the N = 256
# layers); 128 x 64 otherwise. The splits: the blocks that fill the GPU best (64 x 64 x 32, 80
# registers: about 4 per SM; the others about 2), capped where the partials (each slice writes
# and the reduction reads K·C·R·S fp32 values, about 3 TB/s) would cost more than a quarter of
# the main loop (~200 TFLOP/s), and no slice under 8 steps.
TARGET_BLOCKS = {"64x64x32_w2x2_s4": 528, "64x64x64_w2x2_s4": 264, "64x64x64_w2x2_s3": 264,
                 "128x64x32_w2x2_s4": 264, "128x128x32_w2x2_s4": 264, "128x128x32_w2x4_s4": 264,
                 "128x128x64_w2x2_s3": 264}
BIG_TILE_MIN_FLOPS = 10e9
MAIN_LOOP_FLOPS = 200e12  # the main loop's rate, FLOP/s (measured: 150-190 TFLOP/s at one slice)
PARTIAL_BYTES_PER_S = 3e12
PARTIAL_SHARE = 0.25
MIN_SLICE_STEPS = 8
REDUCE_THREADS, REDUCE_BLOCKS = 128, 2112  # the reduction's grid-stride loop over pairs: 16 blocks per SM


@dataclass(frozen=True)
class WgradTile:
    """A ``WGRAD_ENTRY`` of the ``.cu`` file: block tile ``bm`` (filters) x ``bn`` (C·R·S columns)
    x ``bk`` (pixels per step), ``warps_m`` x ``warps_n`` warps, ``stages`` of the cp.async ring."""

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}_s{self.stages}"

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def shared_bytes(self) -> int:
        """The ring: ``stages`` copies of A[BK][BM] and B[BK][BN], 2-byte elements."""
        return self.stages * (self.bm + self.bn) * self.bk * 2


@cache
def tiles() -> dict[str, WgradTile]:
    """{name: `WgradTile`} of the ``WGRAD_ENTRY(...)`` lines of ``14_wgrad.cu`` (the one list)."""
    pat = re.compile(r"^WGRAD_ENTRY\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", re.M)
    found = [WgradTile(*map(int, g)) for g in pat.findall(kernel_path(CU_FILE).read_text())]
    return {t.name: t for t in found}


def fast_div(d: int) -> tuple[int, int]:
    """(mul, shift) with ``n // d == (umulhi(n, mul) + n) >> shift`` for 0 <= n < 2^31, the kernel's
    ``FastDiv``: shift = ceil(log2 d), mul = floor(2^32·(2^shift − d) / d) + 1 (Granlund and
    Montgomery's round-up method; `tests/test_backward.py` checks it).

    Raises:
        ValueError: d outside 1 .. 2^31 − 1.
    """
    if not 1 <= d <= INT32_MAX:
        raise ValueError(f"fast_div: the divisor must be in 1 .. {INT32_MAX}; got {d}")
    shift = (d - 1).bit_length()
    return ((1 << 32) * ((1 << shift) - d)) // d + 1, shift


def fast_div_apply(n: np.ndarray, mul: int, shift: int) -> np.ndarray:
    """The kernel's ``FastDiv`` on the CPU: (umulhi(n, mul) + n) >> shift in unsigned 32-bit arithmetic."""
    n = np.asarray(n, dtype=np.uint64)
    hi = (n * np.uint64(mul)) >> np.uint64(32)
    return ((hi + n) & np.uint64(0xFFFFFFFF)) >> np.uint64(shift)


@dataclass(frozen=True)
class WgradConfig:
    """One run: a tile, the split factor (slices of GEMM-K) and the split-K mode."""

    tile: WgradTile
    splits: int
    mode: str

    def grid(self, p: Conv2dProblem) -> tuple[int, int, int]:
        """(ceil(K / BM), ceil(C·R·S / BN), splits): the slices are the slowest axis."""
        return cdiv(p.K, self.tile.bm), cdiv(p.C * p.R * p.S, self.tile.bn), self.splits


def choose_tile(p: Conv2dProblem) -> WgradTile:
    """64x64x64 (3 stages) for K <= 64; 128x128x32 for a layer of at least `BIG_TILE_MIN_FLOPS`;
    else 128x64x32 (48 KB: what every GPU allows without opt-in)."""
    if p.K <= 64:
        return tiles()["64x64x64_w2x2_s3"]
    return tiles()["128x128x32_w2x2_s4" if p.flops >= BIG_TILE_MIN_FLOPS else "128x64x32_w2x2_s4"]


def choose_splits(p: Conv2dProblem, tile: WgradTile) -> int:
    """The split rule: round(`TARGET_BLOCKS` / output tiles), capped where the partials' traffic
    (splits · K·C·R·S · 8 bytes at `PARTIAL_BYTES_PER_S`) would pass `PARTIAL_SHARE` of the main
    loop's time (FLOPs / `MAIN_LOOP_FLOPS`), and where a slice would get fewer than
    `MIN_SLICE_STEPS` steps of ``tile.bk`` pixels; at least 1."""
    n_tiles = cdiv(p.K, tile.bm) * cdiv(p.C * p.R * p.S, tile.bn)
    steps = cdiv(p.N * p.P * p.Q, tile.bk)
    per_split_s = p.K * p.C * p.R * p.S * 8 / PARTIAL_BYTES_PER_S
    traffic_cap = int(PARTIAL_SHARE * (p.flops / MAIN_LOOP_FLOPS) / per_split_s)
    target = round(TARGET_BLOCKS[tile.name] / n_tiles)
    return max(1, min(target, traffic_cap, steps // MIN_SLICE_STEPS))


def choose_wgrad(p: Conv2dProblem, mode: str = "parallel", tile: WgradTile | str | None = None,
                 splits: int | None = None) -> WgradConfig:
    """The configuration for ``p``: ``tile`` (a `WgradTile` or its name) and ``splits`` left None
    are chosen by `choose_tile` and `choose_splits`; a forced ``splits`` is capped at the steps of
    GEMM-K (`split_k_slices` makes no empty slice)."""
    t = tiles()[tile] if isinstance(tile, str) else tile or choose_tile(p)
    steps = cdiv(p.N * p.P * p.Q, t.bk)
    sp = choose_splits(p, t) if splits is None else min(splits, steps)
    return WgradConfig(t, sp, mode)


def slices(p: Conv2dProblem, cfg: WgradConfig) -> list[tuple[int, int]]:
    """The GEMM-K pixel range [k0, k1) of each slice z, as the kernel computes them."""
    return split_k_slices(p.N * p.P * p.Q, cfg.splits, cfg.tile.bk)


def workspace_bytes(p: Conv2dProblem, cfg: WgradConfig) -> int:
    """parallel: splits fp32 copies of dw; serial: one fp32 dw and one int32 semaphore per output
    tile; one slice: none."""
    kn = p.K * p.C * p.R * p.S
    if cfg.splits == 1:
        return 0
    if cfg.mode == "parallel":
        return 4 * cfg.splits * kn
    gx, gy, _ = cfg.grid(p)
    return 4 * kn + 4 * gx * gy


def wgrad_reason(p: Conv2dProblem, cfg: WgradConfig) -> str | None:
    """None if the kernel runs ``p``, else why not: groups, 16-byte chunks of C and K, 32-bit pixel
    indices (N·P·Q plus two BK steps below 2^31: FastDiv's range) and columns."""
    if p.groups != 1:
        return f"needs groups = 1; got {p.groups}"
    if p.C % 8 or p.K % 8:
        return (f"loads 16-byte chunks of 8 channels of x and of dy: needs C % 8 == 0 and K % 8 == 0; got C = {p.C}, "
                f"K = {p.K} (pad the channels, or use cuDNN)")
    if cfg.mode not in MODES:
        return f"split-K mode {cfg.mode!r}: choose one of {', '.join(MODES)}"
    npq = p.N * p.P * p.Q
    if npq + 2 * cfg.tile.bk > INT32_MAX:
        return (f"GEMM-K = N*P*Q = {npq} pixels: with two BK steps past it, over 2^31 - 1, the range of the "
                "kernel's 32-bit pixel index and FastDiv")
    if p.C * p.R * p.S + cfg.tile.bn > INT32_MAX:
        return f"GEMM-N = C*R*S = {p.C * p.R * p.S} does not fit the kernel's 32-bit column index"
    return None


def wgrad_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgradConfig) -> list[KernelLaunch]:
    """One slice: ``main`` (direct). parallel: ``main`` (partials into the workspace), then ``reduce``.
    serial: ``zero`` (the semaphores), then ``main``."""
    t, i32, u32 = cfg.tile, np.int32, np.uint32
    mode = "direct" if cfg.splits == 1 else cfg.mode
    kn = p.K * p.C * p.R * p.S
    gx, gy, gz = cfg.grid(p)
    main_cfg = LaunchConfig(grid=(gx, gy, gz), block=(t.threads, 1, 1), shared_bytes=t.shared_bytes)
    (pq_mul, pq_shift), (q_mul, q_shift) = fast_div(p.P * p.Q), fast_div(p.Q)
    partial = Buffer("workspace") if mode != "direct" else np.uintp(0)
    sems = Buffer("workspace", 4 * kn) if mode == "serial" else np.uintp(0)
    sizes = (p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, *p.stride, *p.padding, *p.dilation)
    main = KernelLaunch("main", f"wgrad_{t.name}_{mode}_{p.dtype}", main_cfg,
                        (Buffer("x"), Buffer("dy"), Buffer("dw"), partial, sems, *map(i32, sizes),
                         u32(pq_mul), u32(pq_shift), u32(q_mul), u32(q_shift)))
    if mode == "direct":
        return [main]
    if mode == "parallel":
        blocks = min(REDUCE_BLOCKS, cdiv(kn // 2, REDUCE_THREADS))
        red = KernelLaunch("reduce", f"wgrad_reduce_{p.dtype}", LaunchConfig((blocks, 1, 1), (REDUCE_THREADS, 1, 1)),
                           (Buffer("workspace"), Buffer("dw"), np.int64(kn), i32(cfg.splits)))
        return [main, red]
    zero = KernelLaunch("zero", "wgrad_zero", LaunchConfig((cdiv(gx * gy, 256), 1, 1), (256, 1, 1)),
                        (Buffer("workspace", 4 * kn), i32(gx * gy)))
    return [zero, main]


def wgrad_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgradConfig) -> np.ndarray:
    """Writes per dw element (KRSC, flat) of the launch that writes dw: the reduction's grid-stride
    loop over pairs (parallel), or the GEMM tiles of the last slice (serial: only slice
    z = splits − 1 stores dw; direct: the one slice)."""
    kn = p.K * p.C * p.R * p.S
    if cfg.splits > 1 and cfg.mode == "parallel":
        items = grid_stride_items(kn // 2, launch.blocks * launch.threads_per_block)
        return np.bincount(items, minlength=kn // 2).repeat(2)
    visits = tile_visits(launch.grid, cdiv(p.K, cfg.tile.bm), cdiv(p.C * p.R * p.S, cfg.tile.bn))
    return gemm_writes(p.K, p.C * p.R * p.S, cfg.tile.bm, cfg.tile.bn, visits)


def wgrad_tensor_check(p: Conv2dProblem, tensors: dict, epilogue: Epilogue) -> str | None:
    """x and dy 16-byte aligned (cp.async), dw 16-byte aligned (paired and 4-element stores)."""
    return alignment_reason(tensors, {"x": VEC_BYTES, "dy": VEC_BYTES, "dw": VEC_BYTES},
                            "the 16-byte cp.async copies and the paired stores")


def make_wgrad(name: str = "wgrad", mode: str = "parallel", tile: WgradTile | str | None = None,
               splits: int | None = None) -> Variant:
    """A wgrad variant (not registered) with ``mode`` and any of ``tile``, ``splits`` forced (None =
    the rule, `choose_wgrad`).

    Raises:
        ValueError: an unknown mode or tile name, or splits < 1.
    """
    if mode not in MODES:
        raise ValueError(f"split-K mode {mode!r}: choose one of {', '.join(MODES)}")
    if isinstance(tile, str) and tile not in tiles():
        raise ValueError(f"{CU_FILE} has no tile {tile!r}; instantiated: {', '.join(tiles())}")
    if splits is not None and splits < 1:
        raise ValueError(f"splits = {splits}: at least 1 slice")

    forced = ", ".join(f"{k}={v.name if isinstance(v, WgradTile) else v}" for k, v in
                       (("tile", tile), ("splits", splits)) if v is not None)
    return Variant(
        name=name,
        day=14,
        cu_file=CU_FILE,
        summary=f"wgrad: implicit GEMM over N*P*Q with ldmatrix.trans, {mode} split-K"
        + (f" ({forced})" if forced else ""),
        config_fn=partial(choose_wgrad, mode=mode, tile=tile, splits=splits),
        supports_fn=wgrad_reason,
        launches_fn=wgrad_launches,
        covers_fn=wgrad_covers,
        op="wgrad",
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        workspace_fn=workspace_bytes,
        tensor_check_fn=lambda p, tensors, ep, cfg: wgrad_tensor_check(p, tensors, ep),
        min_cc=TENSOR_CORE_CC,
        min_cc_why="cp.async, mma.sync m16n8k16 with bf16, ldmatrix.trans",
    )


WGRAD = register(make_wgrad())
WGRAD_SERIAL = register(make_wgrad("wgrad_serial", mode="serial"))
