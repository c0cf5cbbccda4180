"""Day 22's variant: day 16's Hopper fprop with GEMM-K split across blocks where its output tiles
leave SMs idle (``kernels/conv2d/22_split_k.cu``: day 16's producer, consumers and ring over split
work units, and a reduction kernel).

A split run is two launches:

* ``main``: ``igemm_split_k_<tile>_<dtype>``, day 16's persistent producer and two consumers over
  work units w of splits x tiles: split z = w // tiles of tile w % tiles (day 16's tile order),
  GEMM-K steps [steps·z // splits, steps·(z + 1) // splits) (`split_units`); each unit's fp32
  partial tile goes to the workspace ``part[z][m][k]`` (M x K row-major per split, `partial_writes`);
* ``reduce``: ``split_k_reduce_<dtype>`` sums each element's partials in split order 0, 1, ...,
  splits − 1 in fp32 (the same bits on every run, whatever order the blocks ran in), applies day
  13's epilogue act(alpha·sum + beta·Cin + bias) and rounds once into y (`reduce_writes`,
  `reduce_model`).

Where the rule (`choose`) sees no gain, the variant runs day 16's own launch for day 16's rule
(`days.day16_igemm_wgmma.choose`), built from day 16's file (``FPROP_CU_FILE``):
``igemm_split_k`` is day 16 plus the split, layer by layer.

The rule: the least `split_cost` (the critical path of the busiest SM in FLOP-equivalents of its
tensor cores, a tile's work divided by its efficiency `TILE_EFFICIENCY`, plus the partials' extra
bytes at the GPU's L2 balance and the reduction's launch) over day 16's rule (no split) and every
split entry with 2 .. steps // `MIN_SPLIT_STEPS` splits. Not fitted on a GPU yet: the constants are
day 16's measured tile rates (its `choose` docstring) and the H100's datasheet ratios.

Refused, with the reason (`split_reason`): whatever day 16 refuses for the tile (groups, C % 8,
the maps' limits, 32-bit indices), splits outside 1 .. steps (an empty split), M·K or the
reduction's loop past 32 bits, a workspace over `WORKSPACE_LIMIT`, and the 32-bit ring counter.

Sources: NVIDIA CUTLASS, ``docs/efficient_gemm.md`` (parallelised reductions: split-K with a
separate reduction kernel; "serial" split-K, whose blocks take turns on a semaphore in split order:
deterministic too, but each waits for the one before, and not used here).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F

from helpers.compile import kernel_path
from helpers.epilogue import PLAIN, Epilogue, scalars
from helpers.problem import Conv2dProblem
from helpers.tma import TensorMap
from helpers.tune import Candidate, Machine, Space, gemm_tile_us, register_space
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from . import day18_dgrad_wgmma as d18
from .day16_igemm_wgmma import (
    BK,
    GROUP_M,
    HOPPER_CC,
    ROW_BYTES,
    WgmmaConfig,
    covers,
    gemm_tile,
    group_rows,
    parse_config,
    problem_reason,
    tensor_check,
    tile_coords,
    tile_count,
    w_map,
    wgmma_launches,
    x_map,
)
from .day16_igemm_wgmma import CU_FILE as FPROP_CU_FILE
from .day16_igemm_wgmma import ENTRIES as DAY16_ENTRIES
from .day16_igemm_wgmma import choose as choose_day16
from .day19_wgrad_wgmma import device_sms
from .kit import cdiv, gemm_writes

CU_FILE = "22_split_k.cu"
REDUCE_THREADS = 256
REDUCE_BLOCKS_PER_SM = 8  # the reduction's grid-stride loop: at most 8 blocks of 256 threads per SM
MAX_SPLITS = 16
MIN_SPLIT_STEPS = 4  # no split under 4 GEMM-K steps of 64 channels each: the ring needs steps to fill
WORKSPACE_LIMIT = 2 * 2**30  # the most fp32 partials a run may ask for (bytes)
# A tile's rate per FLOP relative to 128 x 256: a guess, not fitted (day 16's notes put 128 x 64 at about 0.7 of
# 128 x 128's rate, which would make it nearer 0.6 here; the rule's picks on ResNet-50 are the same either way).
TILE_EFFICIENCY = {(128, 256): 1.0, (256, 128): 1.0, (128, 128): 0.85, (128, 64): 0.7, (256, 64): 0.8,
                   (64, 256): 0.8}
L2_FLOP_PER_BYTE = 80.0  # the rule's balance for the partials (written, then read back, mostly from L2): an
# H100 SXM's dense fp16 tensor rate over an L2 rate of ~12 TB/s (989 TFLOP/s / 12 TB/s)
REDUCE_LAUNCH_US = 3.0  # the reduction's launch and tail, µs: a second kernel's fixed cost
SM_TFLOPS = 989.0 / 132  # one SM's dense fp16 tensor rate (TFLOP/s), to put the launch in FLOP-equivalents
NULL = np.uintp(0)  # a pointer argument the kernel does not read


def read_entries() -> tuple[WgmmaConfig, ...]:
    """The tiles the ``.cu`` file instantiates (its ``SPLIT_ENTRY`` lines): day 16's persistent
    configurations of two consumers."""
    text = kernel_path(CU_FILE).read_text()
    rows = re.findall(r"^SPLIT_ENTRY\((\d+), (\d+), (\d+), (\d+)\)", text, re.M)
    return tuple(WgmmaConfig("persistent", int(bm), int(bn), 2, int(st)) for bm, bn, _mt, st in rows)


ENTRIES = read_entries()


@dataclass(frozen=True)
class SplitConfig:
    """One split run: day 16's persistent ``tile`` (its group_m the tile order) and ``splits``
    GEMM-K ranges."""

    tile: WgmmaConfig
    splits: int

    @property
    def name(self) -> str:
        """``<day 16's name>_k<splits>``, e.g. ``persistent_128x256_c2_s4_k5``."""
        return f"{self.tile.name}_k{self.splits}"

    def entry(self, dtype: str) -> str:
        """The kernel's entry point: ``igemm_split_k_<BM>x<BN>_c2_s<STAGES>_<fp16|bf16>``."""
        t = self.tile
        return f"igemm_split_k_{t.bm}x{t.bn}_c2_s{t.stages}_{dtype}"

    @property
    def shared_bytes(self) -> int:
        """The ring, STAGES x (BM + BN) rows of 128 bytes, and 1024 bytes to align it (no staging
        buffers: the partials go from the registers to global memory)."""
        return self.tile.stages * (self.tile.bm + self.tile.bn) * ROW_BYTES + 1024


def steps_of(p: Conv2dProblem) -> int:
    """GEMM-K steps of a tile: R·S·ceil(C / 64)."""
    return p.R * p.S * cdiv(p.C, BK)


def grid_blocks(p: Conv2dProblem, cfg: SplitConfig, sms: int | None = None) -> int:
    """At most one block per SM (persistent), at most one per work unit."""
    return min(tile_count(p, cfg.tile) * cfg.splits, sms or device_sms())


def split_units(p: Conv2dProblem, cfg: SplitConfig) -> dict[str, np.ndarray]:
    """Every work unit w of the kernel's ``SplitScheduler``, as arrays: tm, tn (the tile, by day
    16's `tile_coords`), z (the split) and the GEMM-K steps [lo, hi)."""
    tiles_m, tiles_n = cdiv(p.gemm.m, cfg.tile.bm), cdiv(p.K, cfg.tile.bn)
    tiles, steps = tiles_m * tiles_n, steps_of(p)
    w = np.arange(tiles * cfg.splits)
    z = w // tiles
    tm, tn = tile_coords(w - z * tiles, tiles_m, tiles_n, cfg.tile.group_m)
    return {"w": w, "tm": tm, "tn": tn, "z": z, "lo": z * steps // cfg.splits, "hi": (z + 1) * steps // cfg.splits}


def step_visits(p: Conv2dProblem, cfg: SplitConfig, blocks: int | None = None) -> np.ndarray:
    """How often the blocks of a ``blocks``-wide grid (default `grid_blocks`) compute each GEMM-K
    step of each output tile: shape (tiles_m, tiles_n, steps). Block b takes units b, b + blocks,
    ...; every entry is 1 when the units cover every step of every tile once."""
    it, taken = split_units(p, cfg), units_taken(p, cfg, blocks or grid_blocks(p, cfg))
    tiles_m, tiles_n = cdiv(p.gemm.m, cfg.tile.bm), cdiv(p.K, cfg.tile.bn)
    visits = np.zeros((tiles_m, tiles_n, steps_of(p)), dtype=np.int64)
    for i in np.nonzero(taken)[0]:
        visits[it["tm"][i], it["tn"][i], it["lo"][i]:it["hi"][i]] += taken[i]
    return visits


def units_taken(p: Conv2dProblem, cfg: SplitConfig, blocks: int) -> np.ndarray:
    """How often the blocks of a ``blocks``-wide grid take each work unit: block b takes b, b +
    blocks, ... below the unit count (the kernel's loop)."""
    taken = np.zeros(tile_count(p, cfg.tile) * cfg.splits, dtype=np.int64)
    for b in range(min(blocks, len(taken))):
        taken[b::blocks] += 1
    return taken


def partial_writes(p: Conv2dProblem, cfg: SplitConfig, blocks: int | None = None) -> np.ndarray:
    """Writes per element of the workspace's partials [splits][M][K] (flat) by the main launch on
    a ``blocks``-wide grid (default `grid_blocks`): each unit taken stores its whole tile (rows <
    M, columns < K) into its split's slice."""
    it, taken = split_units(p, cfg), units_taken(p, cfg, blocks or grid_blocks(p, cfg))
    tiles_m, tiles_n = cdiv(p.gemm.m, cfg.tile.bm), cdiv(p.K, cfg.tile.bn)
    out = []
    for z in range(cfg.splits):
        visits = np.zeros((tiles_m, tiles_n), dtype=np.int64)
        mine = it["z"] == z
        np.add.at(visits, (it["tm"][mine], it["tn"][mine]), taken[mine])
        out.append(gemm_writes(p.gemm.m, p.K, cfg.tile.bm, cfg.tile.bn, visits))
    return np.concatenate(out)


def reduce_launch(p: Conv2dProblem, sms: int | None = None) -> LaunchConfig:
    """``split_k_reduce``: a grid-stride loop over M·K / 8 vectors (K % 8 == 0) or M·K elements,
    `REDUCE_THREADS` a block, at most `REDUCE_BLOCKS_PER_SM` blocks per SM."""
    work = p.gemm.m * p.K // 8 if p.K % 8 == 0 else p.gemm.m * p.K
    blocks = max(1, min(cdiv(work, REDUCE_THREADS), REDUCE_BLOCKS_PER_SM * (sms or device_sms())))
    return LaunchConfig(grid=(blocks, 1, 1), block=(REDUCE_THREADS, 1, 1))


def reduce_writes(p: Conv2dProblem, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of y (NHWC, flat, M x K) by ``split_k_reduce`` on ``launch``: thread i of
    the grid takes vectors (elements) i, i + grid·256, ...; vector v writes elements 8v .. 8v + 7."""
    launch = launch or reduce_launch(p)
    threads = launch.grid[0] * launch.block[0]
    plane = p.gemm.m * p.K
    counts = np.zeros(plane, dtype=np.int64)
    if p.K % 8 == 0:
        v = np.concatenate([np.arange(t, plane // 8, threads) for t in range(min(threads, plane // 8))])
        np.add.at(counts, (8 * v[:, None] + np.arange(8)[None, :]).ravel(), 1)
    else:
        e = np.concatenate([np.arange(t, plane, threads) for t in range(min(threads, plane))])
        np.add.at(counts, e, 1)
    return counts


def gemm_operands(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The implicit GEMM's operands in float64 with GEMM-K in the kernel's order, step t = tap
    t // ceil(C / 64) (r = tap // S, s = tap % S), channel block t % ceil(C / 64), 64 channels a
    step (zeros past C): A [M][steps·64] (im2col of NHWC x, zeros outside the image) and B
    [steps·64][K] (the KRSC filter)."""
    cb = cdiv(p.C, BK)
    x64 = x.double().permute(0, 3, 1, 2)  # NCHW for unfold
    cols = F.unfold(x64, (p.R, p.S), dilation=p.dilation, padding=p.padding, stride=p.stride)  # [N][C R S][P Q]
    cols = cols.view(p.N, p.C, p.R * p.S, p.P * p.Q).permute(0, 3, 2, 1)  # [N][PQ][tap][C]
    a = torch.zeros(p.N, p.P * p.Q, p.R * p.S, cb * BK, dtype=torch.float64)
    a[..., :p.C] = cols
    b = torch.zeros(p.K, p.R * p.S, cb * BK, dtype=torch.float64)
    b[..., :p.C] = w.double().reshape(p.K, p.R * p.S, p.C)
    return a.reshape(p.gemm.m, -1), b.reshape(p.K, -1).T


def reduce_model(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, cfg: SplitConfig,
                 skip: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The split run in float32 by the kernel's ranges: each split's partial (float64 products over
    its steps, rounded to float32 as the workspace holds them), then their sum in split order in
    float32 (the reduction's order). ``skip`` = (split, step) leaves that step out, a planted fault.
    Returns (partials [splits][M][K] float32, y [M][K] float32 before rounding to y's dtype)."""
    a, b = gemm_operands(p, x, w)
    steps = steps_of(p)
    parts = []
    for s in range(cfg.splits):
        lo, hi = s * steps // cfg.splits, (s + 1) * steps // cfg.splits
        cols = [t for t in range(lo, hi) if skip != (s, t)]
        ks = torch.cat([torch.arange(t * BK, (t + 1) * BK) for t in cols]) if cols else torch.zeros(0, dtype=torch.long)
        parts.append((a[:, ks] @ b[ks, :]).float())
    total = torch.zeros_like(parts[0])
    for part in parts:
        total = total + part
    return torch.stack(parts), total


# ---- the rule -----------------------------------------------------------------------------------


def tile_efficiency(tile: WgmmaConfig) -> float:
    """The tile's rate per FLOP relative to 128 x 256 (`TILE_EFFICIENCY`; 0.7 for a tile it does not list)."""
    return TILE_EFFICIENCY.get((tile.bm, tile.bn), 0.7)


def split_cost_terms(p: Conv2dProblem, tile: WgmmaConfig, splits: int, sms: int) -> dict[str, float]:
    """`split_cost`'s three terms by name: "main", "partials" and "launch" (the last two 0 without a split)."""
    units = tile_count(p, tile) * splits
    main = cdiv(units, sms) * cdiv(steps_of(p), splits) * 2 * tile.bm * tile.bn * BK / tile_efficiency(tile)
    if splits == 1:
        return {"main": main, "partials": 0.0, "launch": 0.0}
    return {"main": main, "partials": 8 * p.gemm.m * p.K * splits * L2_FLOP_PER_BYTE / sms,
            "launch": REDUCE_LAUNCH_US * SM_TFLOPS * 1e6}


def split_cost(p: Conv2dProblem, tile: WgmmaConfig, splits: int, sms: int) -> float:
    """The model `choose` minimises, in FLOP-equivalents of one SM's tensor cores: the busiest
    SM's units (ceil(units / sms), an unit being a tile's ceil(steps / splits) steps of 2·BM·BN·64
    FLOP, divided by the tile's `TILE_EFFICIENCY`), plus with splits > 1 the partials' 8 bytes per
    element and split (written, read back) at `L2_FLOP_PER_BYTE` spread over the SMs, and the
    reduction's launch (`REDUCE_LAUNCH_US` at one SM's rate). A model of the shape, not a fit."""
    return sum(split_cost_terms(p, tile, splits, sms).values())


def choose(p: Conv2dProblem, sms: int | None = None) -> WgmmaConfig | SplitConfig:
    """Day 16's rule (`days.day16_igemm_wgmma.choose`) or a split entry with 2 .. steps //
    `MIN_SPLIT_STEPS` splits (at most `MAX_SPLITS`), whichever `split_cost` puts lowest (day 16's
    on ties). Day 16's ping-pong picks (at most 4 GEMM-K steps a tile) are kept: too few steps to split."""
    sms = sms or device_sms()
    base = choose_day16(p)
    if base.mode != "persistent" or problem_reason(p, base):
        return base
    best, cost = base, split_cost(p, base, 1, sms)
    top = min(MAX_SPLITS, steps_of(p) // MIN_SPLIT_STEPS)
    for tile in ENTRIES:
        tile = replace(tile, group_m=group_rows(p))
        for s in range(2, top + 1):
            c = split_cost(p, tile, s, sms)
            if c < cost and split_reason(p, SplitConfig(tile, s)) is None:
                best, cost = SplitConfig(tile, s), c
    return best


# ---- the variant ----------------------------------------------------------------------------------


def split_reason(p: Conv2dProblem, cfg: WgmmaConfig | SplitConfig) -> str | None:
    """None if ``cfg`` runs ``p``, else why not (day 16's `problem_reason` for a day-16
    configuration or a split's tile, then the split's own limits)."""
    if isinstance(cfg, WgmmaConfig):
        return problem_reason(p, cfg)
    if cfg.tile.compiled not in ENTRIES:  # e.g. a cluster tile: its maps copy half boxes, the kernel expects whole
        return (f"{cfg.tile.name}: the split kernel instantiates {', '.join(t.name for t in ENTRIES)} "
                f"({CU_FILE}'s SPLIT_ENTRY lines)")
    reason = problem_reason(p, cfg.tile)
    if reason:
        return reason
    steps, plane = steps_of(p), p.gemm.m * p.K
    if not 1 <= cfg.splits <= steps:
        return f"{cfg.splits} splits of {steps} GEMM-K steps: every split needs at least one step"
    if cfg.splits * steps > INT32_MAX:
        return f"splits x GEMM-K steps = {cfg.splits * steps} does not fit the kernel's 32-bit ranges"
    if plane + REDUCE_THREADS * REDUCE_BLOCKS_PER_SM * device_sms() * 8 > INT32_MAX:
        return f"M x K = {plane} (+ one grid of the reduction) does not fit the reduction's 32-bit indices"
    if tile_count(p, cfg.tile) * cfg.splits + 2 * grid_blocks(p, cfg) > INT32_MAX:
        return "the work units (+ two rounds of the grid) do not fit the kernel's 32-bit indices"
    ring = (cdiv(tile_count(p, cfg.tile) * cfg.splits, grid_blocks(p, cfg)) + 1) * cdiv(steps, cfg.splits)
    if ring > INT32_MAX:
        return f"a block's ring steps ({ring}) do not fit the kernel's 32-bit ring counter"
    nbytes = workspace_bytes(p, cfg)
    if nbytes > WORKSPACE_LIMIT:
        return f"the fp32 partials need {nbytes / 2**20:.0f} MiB, over the {WORKSPACE_LIMIT // 2**20} MiB limit"
    return None


def workspace_bytes(p: Conv2dProblem, cfg: WgmmaConfig | SplitConfig) -> int:
    """The fp32 partials, splits·M·K·4 bytes (0 for day 16's launch)."""
    return 4 * cfg.splits * p.gemm.m * p.K if isinstance(cfg, SplitConfig) else 0


def split_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgmmaConfig | SplitConfig) -> list[KernelLaunch]:
    """Day 16's launch for a day-16 configuration; for a split, ``main`` (the maps of x and w as
    day 16 builds them for the tile, the workspace, M, K, P, Q, the strides, paddings and
    dilations, S, taps, cblocks, group_m, splits) and ``reduce`` (the workspace, y, cin, bias, M,
    K, splits, alpha, beta, relu)."""
    if isinstance(cfg, WgmmaConfig):  # built from day 16's file, as day 16 builds it
        return [replace(k, cu_file=FPROP_CU_FILE) for k in wgmma_launches(p, epilogue, cfg)]
    t = cfg.tile
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    ints = (p.gemm.m, p.K, p.P, p.Q, sh, sw, ph, pw, dh, dw, p.S, p.R * p.S, cdiv(p.C, BK), t.group_m, cfg.splits)
    main = KernelLaunch(
        "main", cfg.entry(p.dtype),
        LaunchConfig(grid=(grid_blocks(p, cfg), 1, 1), block=(384, 1, 1), shared_bytes=cfg.shared_bytes),
        (TensorMap("x", x_map(p, t)), TensorMap("w", w_map(p, t)), Buffer("workspace"), *(np.int32(v) for v in ints)))
    ep = scalars(epilogue)
    reduce = KernelLaunch(
        "reduce", f"split_k_reduce_{p.dtype}", reduce_launch(p),
        (Buffer("workspace"), Buffer("y"), Buffer("cin"), Buffer("bias"), np.int32(p.gemm.m), np.int32(p.K),
         np.int32(cfg.splits), ep["alpha"], ep["beta"], ep["relu"]))
    return [main, reduce]


def split_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgmmaConfig | SplitConfig) -> np.ndarray:
    """Writes per element of y by the last launch: day 16's model (`covers`) for its own launch;
    the reduction's (`reduce_writes`) for a split."""
    if isinstance(cfg, WgmmaConfig):
        return covers(p, launch, cfg)
    return reduce_writes(p, launch)


def make_split_k(name: str = "igemm_split_k", config: SplitConfig | None = None) -> Variant:
    """A day-22 variant running ``config`` on every problem, or with None the rule (`choose`)."""
    return Variant(
        name=name,
        day=22,
        cu_file=CU_FILE,
        summary="Hopper fprop with GEMM-K split across blocks where day 16's tiles leave SMs idle, reduced in a "
        "second, deterministic launch" + (f" ({config.name})" if config else ""),
        config_fn=(lambda p: choose(p)) if config is None else (lambda p: config),
        supports_fn=split_reason,
        launches_fn=split_launches,
        covers_fn=split_covers,
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        operands=("cin", "bias"),
        fused_epilogue=True,
        workspace_fn=lambda p, cfg: workspace_bytes(p, cfg),
        tensor_check_fn=lambda p, tensors, ep, cfg: tensor_check(p, tensors, ep),
        min_cc=HOPPER_CC,
        min_cc_why="day 16's wgmma, setmaxnreg and the bulk tensor copy in im2col mode",
        arch_suffix="a",
        configs_fn=None if config is not None else lambda: [
            make_split_k(f"{name}[{t.name}_k{s}]", SplitConfig(t, s)) for t in ENTRIES for s in (2, 3, 5)],
    )


SPLIT_K = register(make_split_k())


# ---- dgrad: day 18's unit-stride dgrad (the filter turned around, then an fprop over dy) with the split


def dgrad_choose(p: Conv2dProblem, sms: int | None = None) -> WgmmaConfig | SplitConfig | None:
    """Day 18's configuration (`days.day18_dgrad_wgmma.choose_config`), or for a unit-stride layer
    the split `choose` picks for its fprop over dy (`days.day18_dgrad_wgmma.fprop_problem`); None
    where day 18 has no fprop equivalent."""
    if d18.shape_reason(p):
        return None
    if d18.strided(p):
        return d18.choose_config(p)
    return choose(d18.fprop_problem(p), sms)


def dgrad_split_reason(p: Conv2dProblem, cfg: WgmmaConfig | SplitConfig | None) -> str | None:
    """Day 18's reasons (`days.day18_dgrad_wgmma.dgrad_reason`) for its own configuration; for a
    split, day 18's shape reasons (a unit stride only), then `split_reason` on the fprop over dy."""
    if not isinstance(cfg, SplitConfig):
        return d18.dgrad_reason(p, cfg)
    if d18.strided(p):
        return "a strided dgrad runs by phases (day 18): the split takes unit-stride layers"
    reason = d18.dgrad_reason(p, None if d18.shape_reason(p) else cfg.tile)
    return reason or split_reason(d18.fprop_problem(p), cfg)


def gemm_problem(p: Conv2dProblem) -> Conv2dProblem:
    """The fprop whose GEMM a run splits: ``p`` itself, or for a dgrad day 18's fprop over dy
    (`days.day18_dgrad_wgmma.fprop_problem`)."""
    return d18.fprop_problem(p) if p.op == "dgrad" else p


def dgrad_filter_bytes(p: Conv2dProblem) -> int:
    """The rotated filter w' at the workspace's start, `days.day18_dgrad_wgmma.aligned`."""
    return d18.aligned(d18.workspace_bytes(p))


def dgrad_workspace_bytes(p: Conv2dProblem, cfg: WgmmaConfig | SplitConfig | None) -> int:
    """Day 18's workspace; with a split, w' and then the fp32 partials of the fprop over dy."""
    if isinstance(cfg, SplitConfig):
        return dgrad_filter_bytes(p) + workspace_bytes(gemm_problem(p), cfg)
    return d18.workspace_bytes(p)


def dgrad_split_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgmmaConfig | SplitConfig | None
                         ) -> list[KernelLaunch]:
    """Day 18's launches (`days.day18_dgrad_wgmma.dgrad_launches`); with a split: day 18's
    ``rotate`` (w' into the workspace, from day 18's file), then `split_launches` on the fprop over
    dy with its tensors renamed: x is dy, w is w' (the workspace's start), the partials the
    workspace past `dgrad_filter_bytes`, y is dx; no Cin or bias (null pointers).

    Raises:
        ValueError: a fused epilogue (dgrad fuses none), or no configuration.
    """
    if not isinstance(cfg, SplitConfig):  # each built from the file day 18 builds it from
        return [k if k.cu_file else replace(k, cu_file=d18.CU_FILE) for k in d18.dgrad_launches(p, epilogue, cfg)]
    if not epilogue.is_plain:
        raise ValueError(f"dgrad_split_k fuses no epilogue: it computes the plain dgrad; got {epilogue}")
    at = dgrad_filter_bytes(p)
    names = {"x": "dy", "w": "workspace", "y": "dx"}
    out = [replace(d18.rotate(p, "rotate", d18.Taps.all(p)), cu_file=d18.CU_FILE)]
    for k in split_launches(d18.fprop_problem(p), PLAIN, cfg):
        args = []
        for a in k.args:
            if isinstance(a, TensorMap):
                a = replace(a, name=names[a.name])
            elif isinstance(a, Buffer) and a.name == "workspace":
                a = replace(a, offset=at)
            elif isinstance(a, Buffer):
                a = replace(a, name=names[a.name]) if a.name in names else NULL
            args.append(a)
        out.append(replace(k, args=tuple(args)))
    return out


def dgrad_split_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgmmaConfig | SplitConfig | None) -> np.ndarray:
    """Writes per dx element (NHWC, flat): day 18's model, or the reduction's on the fprop over dy
    (whose y [N][H][W][C] is dx element for element)."""
    if isinstance(cfg, SplitConfig):
        return reduce_writes(d18.fprop_problem(p), launch)
    return d18.dgrad_covers(p, launch, cfg)


def make_dgrad_split_k(name: str = "dgrad_split_k", config: SplitConfig | None = None) -> Variant:
    """A day-22 dgrad variant: ``config`` forced on the fprop over dy, or with None `dgrad_choose`."""
    return Variant(
        name=name,
        day=22,
        cu_file=CU_FILE,
        summary="dgrad on Hopper: day 18's, with GEMM-K split across blocks where its fprop over dy leaves SMs idle"
        + (f" ({config.name})" if config else ""),
        config_fn=(lambda p: dgrad_choose(p)) if config is None else (lambda p: config),
        supports_fn=dgrad_split_reason,
        launches_fn=dgrad_split_launches,
        covers_fn=dgrad_split_covers,
        op="dgrad",
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        workspace_fn=lambda p, cfg: dgrad_workspace_bytes(p, cfg),
        tensor_check_fn=lambda p, tensors, ep, cfg: d18.dgrad_tensor_check(p, tensors),
        min_cc=HOPPER_CC,
        min_cc_why="day 16's wgmma, setmaxnreg and the bulk tensor copy in im2col mode",
        arch_suffix="a",
    )


DGRAD_SPLIT_K = register(make_dgrad_split_k())


# ---- day 15's search space: day 16's entries unsplit, and every split entry x splits -------------

SPLIT_NAME = re.compile(r"(.+)_k(\d+)")


def parse_split_config(config: str) -> WgmmaConfig | SplitConfig:
    """``"persistent_128x256_c2_s4_g8_k5"`` -> that `SplitConfig`; a day-16 name (no ``_k``) ->
    its `WgmmaConfig` (`days.day16_igemm_wgmma.parse_config`).

    Raises:
        ValueError: a name neither day builds (a tile without a ``SPLIT_ENTRY`` line, splits < 2).
    """
    m = SPLIT_NAME.fullmatch(config)
    if not m:
        return parse_config(config)
    tile, splits = parse_config(m.group(1)), int(m.group(2))
    if tile.compiled not in ENTRIES or splits < 2:
        raise ValueError(f"{config!r}: a split runs one of {', '.join(t.name for t in ENTRIES)} with 2 or more splits")
    return SplitConfig(tile, splits)


@functools.cache
def space_variant(config: str) -> Variant:
    """The variant forcing a configuration name (one object per name)."""
    return make_split_k(f"igemm_split_k[{config}]", parse_split_config(config))


def split_tile_us(p: Conv2dProblem, cfg: SplitConfig, machine: Machine) -> float:
    """The model's time of a split run: day 16's tile on ceil(steps / splits) steps per unit, its
    blocks times the splits, the partials' 8 bytes per element and split as extra traffic, plus
    the reduction's launch."""
    base = gemm_tile(p, cfg.tile)
    t = replace(base, steps=cdiv(steps_of(p), cfg.splits), splits=cfg.splits,
                extra_bytes=8 * p.gemm.m * p.K * cfg.splits, shared_bytes=cfg.shared_bytes)
    return gemm_tile_us(t, machine) + machine.launch_us


def space_candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Day 16's entries unsplit (family: their schedule) and each split entry with 2 ..
    min(`MAX_SPLITS`, steps // `MIN_SPLIT_STEPS`) splits (family ``split``), at the problem's tile
    order (`group_rows`); the rule (`choose`) is the prior."""
    rule, g = choose(p, machine.sms), group_rows(p)
    out = [Candidate(c.name, v, gemm_tile_us(gemm_tile(p, c), machine), c == rule, family=c.mode)
           for c in (replace(e, group_m=g) for e in DAY16_ENTRIES)
           for v in [space_variant(c.name)]]
    top = min(MAX_SPLITS, steps_of(p) // MIN_SPLIT_STEPS)
    for tile in ENTRIES:
        for s in range(2, top + 1):
            cfg = SplitConfig(replace(tile, group_m=g), s)
            if split_reason(p, cfg) is None:
                out.append(Candidate(cfg.name, space_variant(cfg.name), split_tile_us(p, cfg, machine), cfg == rule,
                                     family="split"))
    return out


def space_variations(config: str, p: Conv2dProblem) -> list[str]:
    """The other tile order (row-major or groups of `GROUP_M` m-tiles): a kernel argument, no new build."""
    cfg = parse_split_config(config)
    if isinstance(cfg, WgmmaConfig):
        return [replace(cfg, group_m=GROUP_M if cfg.group_m == 1 else 1).name]
    tile = replace(cfg.tile, group_m=GROUP_M if cfg.tile.group_m == 1 else 1)
    return [SplitConfig(tile, cfg.splits).name]


SPACE = register_space(Space("igemm_split_k", space_candidates, space_variations, lambda cfg, p: space_variant(cfg),
                             summary="day 16's entries unsplit, and its persistent tiles x 2 .. 16 GEMM-K splits",
                             sources=("16_igemm_wgmma.cu",)))
