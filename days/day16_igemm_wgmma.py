"""Day 16's variant: the Hopper kernel of ``kernels/conv2d/16_igemm_wgmma.cu`` (TMA loads, wgmma,
mbarriers, warp specialisation, persistent blocks), its tensor maps, refusals and coverage model.

A `WgmmaConfig` names one compiled entry: the schedule (``one_wg``, ``specialised``,
``persistent``, ``pingpong``, ``cluster``, ``cluster_a``: the ladder of day 17's notebook), block tile BM x BN,
consumer warpgroups and stages.
`ENTRIES` is read from the ``.cu`` file's ``WGMMA_ENTRY`` lines, the one list of what is built; a
configuration also carries the tile order (``group_m``, a kernel argument: `tile_coords`).
`make_wgmma` builds a variant with one configuration forced (the ladder's steps in day 17's
notebook); the registered ``igemm_wgmma`` picks one per problem (`choose`). The ring's programs
are replayed in Python (`replay_ring`, on model mbarriers), and `schedule_timeline` draws the
persistent and ping-pong schedules as a schematic.

The tensor maps (`helpers.tma`): x as an `helpers.tma.Im2colMap` (dims C, W, H, N; BM pixels of
64 channels per copy; the bounding box that holds exactly P x Q output pixels per image), w as a
`helpers.tma.TiledMap` (dims C, S, R, K; boxes of 64 channels x 1 x 1 x BN), and y, which the
epilogue stores through, as a `helpers.tma.TiledMap` of the GEMM's M x K (boxes of 64 x 64) when
K % 8 == 0. Problems outside the
im2col mode's limits (padding or box corners beyond -128 .. 127, a filter reach (R-1) dil_h or
(S-1) dil_w of 256 or more, strides above 8), with C % 8 != 0 (the copy engine's 16-byte strides)
or groups > 1 are refused with the reason: day 13's kernel runs them.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter, defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch

from helpers import gpu
from helpers.compile import kernel_path
from helpers.epilogue import Epilogue, scalars
from helpers.problem import Conv2dProblem
from helpers.tma import ELEMENT_BYTES, OFFSET_LIMIT, UNUSED_MAP, Im2colMap, TensorMap, TiledMap
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .day13_igemm_production.space import dram_bytes
from .kit import VEC_BYTES, alignment_reason, cdiv, gemm_writes, grid_stride_items, groups_one_reason

CU_FILE = "16_igemm_wgmma.cu"
HOPPER_CC = (9, 0)
BK = 64  # GEMM-K per stage: 64 channels, one 128-byte swizzled row
ROW_BYTES = 2 * BK
STAGE_COLS = 64  # the epilogue's sub-tile: 64 x 64, one box of y's map
STAGE_BYTES = 2 * 64 * STAGE_COLS * 2  # the epilogue's two staging buffers per consumer warpgroup
MODES = ("one_wg", "specialised", "persistent", "pingpong", "cluster", "cluster_a")
PERSISTENT_MODES = ("persistent", "pingpong", "cluster", "cluster_a")  # one block per SM, looping over tiles
CLUSTER_MODES = ("cluster", "cluster_a")  # pairs of blocks sharing B (pairs of m-tiles) or A (pairs of n-tiles)
CLUSTER = 2  # blocks per cluster of the cluster schedules: pairs of tiles sharing B (cluster) or A (cluster_a)
DEFAULT_SMS = 132  # an H200's multiprocessors: the persistent grid when no GPU is there to ask
DEFAULT_L2 = 50 * 2**20  # an H200's L2 in bytes, when no GPU is there to ask
GROUP_M = 8  # m-tiles per group of the tile order (`tile_coords`) when the filter does not stay in L2


@dataclass(frozen=True)
class WgmmaConfig:
    """One entry of the kernel: schedule ``mode``, block tile ``bm`` x ``bn``, ``consumers`` math
    warpgroups (each bm / consumers rows x bn of the tile; ``pingpong``: each a whole tile, the
    block's tiles in turn), ``stages`` ring slots; and a kernel argument, ``group_m`` m-tiles per
    group of the tile order (`tile_coords`; 1: row-major)."""

    mode: str
    bm: int
    bn: int
    consumers: int
    stages: int
    group_m: int = 1

    @property
    def compiled(self) -> WgmmaConfig:
        """The entry this configuration launches (its argument at the default)."""
        return replace(self, group_m=1)

    @property
    def name(self) -> str:
        """``<mode>_<bm>x<bn>_c<consumers>_s<stages>``, then ``_g<group_m>`` when group_m > 1."""
        extra = f"_g{self.group_m}" if self.group_m != 1 else ""
        return f"{self.mode}_{self.bm}x{self.bn}_c{self.consumers}_s{self.stages}{extra}"

    def entry(self, dtype: str) -> str:
        return f"igemm_wgmma_{self.compiled.name}_{dtype}"

    @property
    def threads(self) -> int:
        """128 per warpgroup: the consumers, plus the producer when specialised."""
        return 128 * (self.consumers + (self.mode != "one_wg"))

    @property
    def m_tiles(self) -> int:
        """MT, the 64-row m-tiles of one consumer warpgroup (the ``WGMMA_ENTRY`` lines' fifth
        field): bm / 64 with ping-pong (each consumer owns a whole tile), else bm / (64 consumers)."""
        return self.bm // 64 // (1 if self.mode == "pingpong" else self.consumers)

    @property
    def shared_bytes(self) -> int:
        """The ring, STAGES x (BM + BN) rows of 128 bytes, two 64 x 64-half staging buffers per
        consumer (16 KB), and 1024 bytes to align the ring to 1024."""
        return self.stages * (self.bm + self.bn) * ROW_BYTES + self.consumers * STAGE_BYTES + 1024


def read_entries() -> tuple[WgmmaConfig, ...]:
    """The configurations the ``.cu`` file instantiates, from its ``WGMMA_ENTRY`` lines."""
    text = kernel_path(CU_FILE).read_text()
    rows = re.findall(r"^WGMMA_ENTRY\(\w+, (\w+), (\d+), (\d+), (\d+), (\d+), (\d+)\)", text, re.M)
    return tuple(WgmmaConfig(mode, int(bm), int(bn), int(cons), int(st)) for mode, bm, bn, _mt, cons, st in rows)


ENTRIES = read_entries()
BY_NAME = {c.name: c for c in ENTRIES}
REG_TARGETS = re.compile(r"^constexpr int (PAIR_)?PRODUCER_REGS = (\d+), (?:PAIR_)?CONSUMER_REGS = (\d+);", re.M)


def setmaxnreg_targets(cfg: WgmmaConfig) -> tuple[int, int]:
    """Registers per thread that setmaxnreg gives ``cfg``'s producer warpgroup and each consumer
    warpgroup: the ``.cu`` file's PRODUCER_REGS and CONSUMER_REGS, or PAIR_PRODUCER_REGS and
    PAIR_CONSUMER_REGS for ``cluster`` and ``cluster_a``. ``one_wg`` moves none: (0, 0).

    Raises:
        ValueError: the constants are not in the file.
    """
    if cfg.mode == "one_wg":
        return 0, 0
    found = {bool(pair): (int(p), int(c)) for pair, p, c in REG_TARGETS.findall(kernel_path(CU_FILE).read_text())}
    if set(found) != {False, True}:
        raise ValueError(f"{CU_FILE}: the setmaxnreg constants (PRODUCER_REGS, ..., PAIR_CONSUMER_REGS) moved")
    return found[cfg.mode in CLUSTER_MODES]


def moved_registers(cfg: WgmmaConfig) -> int:
    """Registers the block holds after the producer's setmaxnreg.dec and the consumers' .inc
    (128 threads per warpgroup; 0 for ``one_wg``, which moves none). Must stay within the launch
    allocation (ptxas's registers x threads), or .inc waits forever."""
    producer, consumer = setmaxnreg_targets(cfg)
    return 128 * producer + 128 * cfg.consumers * consumer


def x_map(p: Conv2dProblem, cfg: WgmmaConfig) -> Im2colMap:
    """The im2col map of x (NHWC: dims C, W, H, N): BM pixels of 64 channels per copy, in the
    bounding box from (-pad_w, -pad_h) to ((Q-1) stride_w - pad_w, (P-1) stride_h - pad_h),
    walked with the strides; the upper corner is relative to (W - 1, H - 1). ``cluster_a``: BM / 2
    pixels per copy (each producer of a pair copies half of A)."""
    (sh, sw), (ph, pw) = p.stride, p.padding
    e = ELEMENT_BYTES[p.dtype]
    pixels = cfg.bm // CLUSTER if cfg.mode == "cluster_a" else cfg.bm  # a pair's producers copy half of A each
    return Im2colMap(
        dtype=p.dtype,
        dims=(p.C, p.W, p.H, p.N),
        strides=(p.C * e, p.W * p.C * e, p.H * p.W * p.C * e),
        lower=(-pw, -ph),
        upper=((p.Q - 1) * sw - pw - (p.W - 1), (p.P - 1) * sh - ph - (p.H - 1)),
        channels=BK,
        pixels=pixels,
        element_strides=(1, sw, sh, 1),
    )


def w_map(p: Conv2dProblem, cfg: WgmmaConfig) -> TiledMap:
    """The tiled map of the KRSC filter (dims C, S, R, K): boxes of 64 channels x 1 x 1 x BN filters."""
    e = ELEMENT_BYTES[p.dtype]
    rows = cfg.bn // CLUSTER if cfg.mode == "cluster" else cfg.bn  # a pair's producers copy half of B each
    return TiledMap(dtype=p.dtype, dims=(p.C, p.S, p.R, p.K), strides=(p.C * e, p.S * p.C * e, p.R * p.S * p.C * e),
                    box=(BK, 1, 1, rows))


def y_map(p: Conv2dProblem) -> TiledMap:
    """The tiled map of y as the GEMM's M x K matrix (dims K, M = N P Q): boxes of 64 x 64, the
    128-byte swizzle; the epilogue's stores (K % 8 == 0: rows of 16-byte multiples)."""
    e = ELEMENT_BYTES[p.dtype]
    return TiledMap(dtype=p.dtype, dims=(p.K, p.gemm.m), strides=(p.K * e,), box=(STAGE_COLS, 64))


def problem_reason(p: Conv2dProblem, cfg: WgmmaConfig) -> str | None:
    """None if ``cfg`` runs ``p``, else why not: groups, channels, the copy engine's limits on both
    maps, the filter offsets of the im2col copies, 32-bit indices and the 32-bit ring counter
    (`ring_steps`)."""
    reason = groups_one_reason(p)
    if reason:
        return reason
    if p.C % 8:
        return f"C = {p.C}: the copy engine needs C % 8 == 0 (16-byte pixel strides); day 13's kernel takes any C"
    (dh, dw) = p.dilation
    limit = OFFSET_LIMIT[4]  # the filter offsets of a 4-d im2col copy
    for what, reach in (("(R-1)*dil_h", (p.R - 1) * dh), ("(S-1)*dil_w", (p.S - 1) * dw)):
        if reach >= limit:
            return f"filter reach {what} = {reach}: an im2col copy's filter offset is 8 bits (< {limit})"
    maps = {"x": x_map(p, cfg), "w": w_map(p, cfg), **({"y": y_map(p)} if p.K % 8 == 0 else {})}
    for name, desc in maps.items():
        reason = desc.reason()
        if reason:
            return f"{name} tensor map: {reason}"
    m, tiles = p.gemm.m, tile_count(p, cfg)
    if m + cfg.bm > INT32_MAX or p.R * p.S * cdiv(p.C, BK) > INT32_MAX:
        return f"GEMM-M = {m} (+ one tile) or the GEMM-K steps do not fit the kernel's 32-bit indices"
    if tiles + 2 * grid_blocks(p, cfg) > INT32_MAX or cfg.group_m * cdiv(p.K, cfg.bn) > INT32_MAX:
        return f"{tiles} output tiles (+ two rounds of the grid) do not fit the kernel's 32-bit tile indices"
    return ring_reason(p, cfg)


def ring_reason(p: Conv2dProblem, cfg: WgmmaConfig, blocks: int | None = None) -> str | None:
    """None if the kernel's 32-bit ring counter holds `ring_steps` on a grid of ``blocks`` (default
    `grid_blocks`), else the reason."""
    ring = ring_steps(p, cfg, blocks)
    if ring <= INT32_MAX:
        return None
    return (f"a block's ring steps, (tiles per block + 1) x GEMM-K steps = {ring}, do not fit the kernel's "
            f"32-bit ring counter u (at most {INT32_MAX})")


def ring_steps(p: Conv2dProblem, cfg: WgmmaConfig, blocks: int | None = None) -> int:
    """The largest value the kernel's ``int u`` (ring steps of one block, counted across all its
    tiles) can take, plus one tile: (work items per block + 1) x GEMM-K steps, the work items the
    output tiles (pair tiles for ``cluster`` and ``cluster_a``) dealt out over the grid's
    ``blocks`` (default `grid_blocks`; pairs of them for the clusters). The + 1: a ping-pong
    consumer starts at its partner's first tile and skips each of its tiles."""
    blocks = grid_blocks(p, cfg) if blocks is None else blocks
    if cfg.mode in CLUSTER_MODES:
        items, blocks = pair_tiles(p, cfg), blocks // CLUSTER
    else:
        items = tile_count(p, cfg)
    return (cdiv(items, max(blocks, 1)) + 1) * p.R * p.S * cdiv(p.C, BK)


PINGPONG_STEPS = 4  # at most this many GEMM-K steps per tile: the epilogue is a large share, ping-pong hides it


def last_wave_fill(tiles: int, sms: int) -> float:
    """The share of the SMs' tile slots the tiles use, one tile per SM per wave: tiles / (waves x
    SMs), 1.0 when the last wave is full."""
    return tiles / (cdiv(tiles, sms) * sms)


def choose(p: Conv2dProblem) -> WgmmaConfig:
    """The configuration the registered variant runs. At most `PINGPONG_STEPS` GEMM-K steps per
    tile (R S ceil(C / 64) <= 4: 1x1 layers with C <= 256): ping-pong (128 x 64 when K <= 64, else
    128 x 128), whose two consumers store one tile while computing the other. Else persistent: a
    large tile, or 128 x 128 (128 x 64 when K <= 64) if that fills the last wave of the SMs better
    (`last_wave_fill`; ties go to the large tile, which reads less per FLOP). The large tile is
    256 x 64 when K <= 64 (a wider one would compute filters that are not there), 128 x 256 when
    K % 256 == 0 (each consumer's m64n256 wgmma reads its B tile once, where 256 x 128's two
    m64n128 read it twice), else 256 x 128. A 128 x 128 pick whose tiles fill at most half the SMs
    is halved to 128 x 64, which runs at about 0.7 of its rate per FLOP but keeps twice the SMs
    busy. The tile order: groups of `GROUP_M` m-tiles when the filter is larger than half the L2
    (`group_rows`), else row-major.

    Fitted on the H200 (2026-12-04, in sample: ResNet-50's 38 problems, every configuration timed
    in one run against cuDNN, the run committed with 7a28a77): the rule reaches 1.034x cuDNN at
    N = 32 and 0.997x at N = 256 (geomeans), against 1.048x and 1.001x for the best configuration
    per layer; the rule before it (8 ping-pong steps, 256 x 128 for every large tile, no halving)
    reached 1.005x and 0.993x on the same run. Out of sample: VGG-16's and U-Net's 3x3 layers at
    N = 8 (day 17's notebook, section 6). The tile order (2026-12-04): on the GEMM-shaped 1x1 layer
    (N P Q = C = K = 8192, a 128 MiB filter) groups of 8 m-tiles took persistent_256x128 from
    1.718 to 1.658 ms (-3.5 %); on ResNet-50 (filters up to 4.5 MiB) they changed the rule's
    configurations by -4 % .. +1 %.
    """
    sms = _sms()
    narrow = p.K <= 64
    if p.R * p.S * cdiv(p.C, BK) <= PINGPONG_STEPS:
        cfg = BY_NAME["pingpong_128x64_c2_s8" if narrow else "pingpong_128x128_c2_s6"]
    else:
        large = "256x64_c2_s4" if narrow else "128x256_c2_s4" if p.K % 256 == 0 else "256x128_c2_s4"
        small = "128x64_c2_s8" if narrow else "128x128_c2_s6"
        big, cfg = BY_NAME[f"persistent_{large}"], BY_NAME[f"persistent_{small}"]
        if last_wave_fill(tile_count(p, big), sms) >= last_wave_fill(tile_count(p, cfg), sms):
            cfg = big
        elif not narrow and 2 * tile_count(p, cfg) <= sms:
            cfg = BY_NAME["persistent_128x64_c2_s8"]
    return replace(cfg, group_m=group_rows(p))


def tile_count(p: Conv2dProblem, cfg: WgmmaConfig) -> int:
    """Output tiles of ``cfg`` on ``p``: ceil(GEMM-M / BM) x ceil(K / BN)."""
    return cdiv(p.gemm.m, cfg.bm) * cdiv(p.K, cfg.bn)


def group_rows(p: Conv2dProblem) -> int:
    """m-tiles per group of the tile order: `GROUP_M` when the filter (K R S C elements) takes more
    than half the L2, else 1 (row-major). In row-major order the tiles in flight read one or two
    rows of A and every column tile of B: all of the filter, which then streams from DRAM again for
    every row of tiles; groups of m-tiles read a few columns of B and a few rows of A at a time.
    A filter that stays in L2 gains nothing from it."""
    return GROUP_M if p.K * p.R * p.S * p.C * p.itemsize > _l2_bytes() / 2 else 1


def _properties():
    """torch's properties of the kernels' device (`helpers.gpu.context_device`), or None without a
    GPU. Read through torch, not pycuda: a plan is made before `helpers.launch.prepare`'s tensor
    checks and must not initialise pycuda's context."""
    if not gpu.has_gpu():
        return None
    return torch.cuda.get_device_properties(gpu.context_device().index)


def _sms() -> int:
    """The GPU's multiprocessors, or `DEFAULT_SMS` without a GPU to ask."""
    props = _properties()
    return props.multi_processor_count if props is not None else DEFAULT_SMS


def _l2_bytes() -> int:
    """The GPU's L2 in bytes, or `DEFAULT_L2` without a GPU to ask."""
    props = _properties()
    return (props.L2_cache_size or DEFAULT_L2) if props is not None else DEFAULT_L2


def tile_coords(t: np.ndarray, tiles_m: int, tiles_n: int, group_m: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernel's tile order (``tile_coords`` in the ``.cu`` file): linear tiles ``t`` -> (tm, tn),
    in groups of ``group_m`` m-tiles (the last group shorter) whose tiles walk the group's m-tiles
    first, then its columns; ``group_m`` = 1 is row-major. A bijection of 0 .. tiles_m tiles_n - 1."""
    t = np.asarray(t, dtype=np.int64)
    span = group_m * tiles_n
    first = t // span * group_m
    rows = np.minimum(group_m, tiles_m - first)
    r = t % span
    return first + r % rows, r // rows


def grid_blocks(p: Conv2dProblem, cfg: WgmmaConfig) -> int:
    """Blocks of the launch: one per output tile, or for ``persistent`` and ``pingpong`` at most
    one per SM; ``cluster`` and ``cluster_a``: two per pair tile (`pair_tiles`), at most one pair
    per two SMs."""
    if cfg.mode in CLUSTER_MODES:
        return CLUSTER * min(pair_tiles(p, cfg), _sms() // CLUSTER)
    tiles = tile_count(p, cfg)
    return tiles if cfg.mode not in PERSISTENT_MODES else min(tiles, _sms())


def pair_grid(p: Conv2dProblem, cfg: WgmmaConfig) -> tuple[int, int]:
    """The cluster schedules' grid of pair tiles: ``cluster`` pairs vertically adjacent tiles,
    ceil(tiles_m / 2) x tiles_n; ``cluster_a`` horizontally adjacent ones, tiles_m x ceil(tiles_n / 2)."""
    tiles_m, tiles_n = cdiv(p.gemm.m, cfg.bm), cdiv(p.K, cfg.bn)
    return (cdiv(tiles_m, CLUSTER), tiles_n) if cfg.mode == "cluster" else (tiles_m, cdiv(tiles_n, CLUSTER))


def pair_tiles(p: Conv2dProblem, cfg: WgmmaConfig) -> int:
    """The cluster schedules' work items: the pair tiles of `pair_grid`."""
    pm, pn = pair_grid(p, cfg)
    return pm * pn


def wgmma_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgmmaConfig) -> list[KernelLaunch]:
    """One launch of ``cfg``'s entry on the maps of x, w and y (`UNUSED_MAP` for y when K % 8 != 0:
    the threads store y then), y, cin, bias, M, K, P, Q, the strides, paddings and dilations, S,
    taps = R * S, cblocks = ceil(C / 64), group_m (int32), alpha, beta (float32) and relu (int32)."""
    ep = scalars(epilogue)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    ints = (p.gemm.m, p.K, p.P, p.Q, sh, sw, ph, pw, dh, dw, p.S, p.R * p.S, cdiv(p.C, BK), cfg.group_m)
    ymap = TensorMap("y", y_map(p)) if p.K % 8 == 0 else UNUSED_MAP
    args = (TensorMap("x", x_map(p, cfg)), TensorMap("w", w_map(p, cfg)), ymap, Buffer("y"), Buffer("cin"),
            Buffer("bias"), *(np.int32(v) for v in ints), ep["alpha"], ep["beta"], ep["relu"])
    config = LaunchConfig(grid=(grid_blocks(p, cfg), 1, 1), block=(cfg.threads, 1, 1), shared_bytes=cfg.shared_bytes)
    return [KernelLaunch("main", cfg.entry(p.dtype), config, args)]


def covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgmmaConfig) -> np.ndarray:
    """Writes per element of Y[m][k] (NHWC, flat): block b computes tiles b, b + grid, ... (the
    persistent loop, which ping-pong deals out to its two consumers in turn; one tile per block
    otherwise), tile t at `tile_coords`, and stores its rows < M and columns < K once. ``cluster``:
    pair c = b // 2 walks pair tiles c, c + grid / 2, ... (`pair_grid`), and rank b % 2 computes
    m-tile 2 pm + rank of pair tile (pm, tn), or with ``cluster_a`` n-tile 2 pn + rank of (tm, pn);
    a rank past the last m-tile (n-tile) stores nothing."""
    tiles_m, tiles_n = cdiv(p.gemm.m, cfg.bm), cdiv(p.K, cfg.bn)
    if cfg.mode in CLUSTER_MODES:
        (rows, cols), pairs = pair_grid(p, cfg), pair_tiles(p, cfg)
        items = grid_stride_items(pairs, launch.grid[0] // CLUSTER)
        pm, pn = tile_coords(items[items < pairs], rows, cols, cfg.group_m)
        ranks = range(CLUSTER)
        if cfg.mode == "cluster":
            tm, tn = np.concatenate([CLUSTER * pm + r for r in ranks]), np.tile(pn, CLUSTER)
        else:
            tm, tn = np.tile(pm, CLUSTER), np.concatenate([CLUSTER * pn + r for r in ranks])
    else:
        tiles = tiles_m * tiles_n
        looping = cfg.mode in PERSISTENT_MODES
        items = grid_stride_items(tiles, launch.grid[0]) if looping else np.arange(min(launch.grid[0], tiles))
        tm, tn = tile_coords(items[items < tiles], tiles_m, tiles_n, cfg.group_m)
    keep = (tm < tiles_m) & (tn < tiles_n)
    visits = np.zeros((tiles_m, tiles_n), dtype=np.int64)
    np.add.at(visits, (tm[keep], tn[keep]), 1)
    return gemm_writes(p.gemm.m, p.K, cfg.bm, cfg.bn, visits)


def tensor_check(p: Conv2dProblem, tensors: dict, epilogue: Epilogue) -> str | None:
    """x and w 16-byte aligned, and y when K % 8 == 0 (the copy engine's global addresses: its
    loads, and the epilogue's stores); cin, when it is read, 4-byte aligned when K is even (the
    epilogue's 32-bit reads of column pairs). None or the reason."""
    tma = {"x": VEC_BYTES, "w": VEC_BYTES, **({"y": VEC_BYTES} if p.K % 8 == 0 else {})}
    reason = alignment_reason(tensors, tma, "the copy engine's (TMA) global addresses")
    if reason is None and p.K % 2 == 0 and epilogue.beta != 0:
        reason = alignment_reason(tensors, {"cin": 4}, "the epilogue's 32-bit Cin reads")
    return reason


def _nhwc(**kw) -> Conv2dProblem:
    return Conv2dProblem(layout="NHWC", dtype="fp16", **kw)


# Problems the kernel takes, chosen to break it (the tests and the notebook check every
# configuration on them): one GEMM-K step, K that divides no tile, stride with dilation on either
# axis, a partial last channel block, padding that leaves rows with no tap inside the image, C = 8.
CHECK_PROBLEMS = [
    _nhwc(N=1, C=64, H=8, W=8, K=128, R=1, S=1),  # one GEMM-K step
    _nhwc(N=2, C=64, H=15, W=13, K=70, R=3, S=3, padding=1),
    _nhwc(N=3, C=40, H=9, W=11, K=34, R=2, S=3, padding=(1, 0), stride=2, dilation=(1, 2)),  # channel block 40/64
    _nhwc(N=2, C=256, H=14, W=14, K=256, R=1, S=1),
    _nhwc(N=1, C=24, H=10, W=9, K=33, R=4, S=5, padding=(6, 7), dilation=(3, 1)),  # rows with no tap inside
    _nhwc(N=2, C=72, H=17, W=6, K=300, R=3, S=2, padding=(2, 1), stride=(1, 2), dilation=(2, 1)),
    _nhwc(N=4, C=8, H=23, W=19, K=5, R=5, S=5, padding=2, stride=(3, 2)),  # C = 8, K odd
    _nhwc(N=2, C=136, H=12, W=12, K=257, R=3, S=3, padding=1, stride=(2, 1)),
]

# Problems of several tiles per block for every schedule on a capped grid (`capped`): GEMM-M of 612
# and 1,200 pixels (3 to 19 m-tiles), K = 136 (1 to 3 n-tiles, the last partial), 9 and 18 GEMM-K
# steps per tile, so the ring wraps within a tile and across tiles; the first is also the smoke
# problem the sanitizers run (x under 10,000 elements).
MULTI_TILE_PROBLEMS = [
    _nhwc(N=2, C=16, H=17, W=18, K=136, R=3, S=3, padding=1),
    _nhwc(N=2, C=72, H=24, W=25, K=136, R=3, S=3, padding=1, dilation=(2, 1)),
]

# Problems beyond the kernel's limits, each with a word of the reason it is refused with.
BEYOND_LIMITS = [
    (_nhwc(N=1, C=3, H=16, W=16, K=8, R=3, S=3, padding=1), "C % 8"),
    (_nhwc(N=1, C=12, H=16, W=16, K=8, R=3, S=3, padding=1), "C % 8"),
    (_nhwc(N=1, C=16, H=16, W=16, K=16, R=3, S=3, padding=1, groups=2), "groups"),
    (_nhwc(N=1, C=16, H=300, W=300, K=8, R=3, S=3, dilation=(128, 1)), "filter offset is 8 bits"),
    (_nhwc(N=1, C=16, H=300, W=300, K=8, R=3, S=3, dilation=(1, 70)), "corner"),
    (_nhwc(N=1, C=16, H=8, W=8, K=8, R=3, S=3, padding=(129, 1)), "corner"),
    (_nhwc(N=1, C=16, H=40, W=40, K=8, R=1, S=1, stride=(9, 1)), "element strides"),
]


def make_wgmma(name: str = "igemm_wgmma", config: WgmmaConfig | str | None = None) -> Variant:
    """A day-16 variant (not registered) running ``config`` (a `WgmmaConfig` or its name) on every
    problem, or with None the per-problem `choose`.

    Raises:
        ValueError: a configuration the ``.cu`` file does not instantiate (the message lists them).
    """
    if isinstance(config, str):
        if config not in BY_NAME:
            raise ValueError(f"no entry {config!r} in {CU_FILE}; it has: {', '.join(BY_NAME)}")
        config = BY_NAME[config]
    if config is not None and config.compiled not in ENTRIES:
        raise ValueError(f"{config.name} is not instantiated in {CU_FILE}; it has: {', '.join(BY_NAME)}")
    if config is not None and config.group_m < 1:
        raise ValueError(f"{config.name}: group_m must be at least 1")

    return Variant(
        name=name,
        day=16,
        cu_file=CU_FILE,
        summary="Hopper: TMA (im2col + tiled) loads, wgmma from shared memory, mbarrier ring, "
        "producer/consumer warpgroups, persistent tiles, fused epilogue" + (f" ({config.name})" if config else ""),
        config_fn=choose if config is None else lambda p: config,
        supports_fn=problem_reason,
        launches_fn=wgmma_launches,
        covers_fn=covers,
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        operands=("cin", "bias"),
        fused_epilogue=True,
        tensor_check_fn=lambda p, tensors, ep, cfg: tensor_check(p, tensors, ep),
        min_cc=HOPPER_CC,
        min_cc_why="wgmma, setmaxnreg and the bulk tensor copy in im2col mode",
        arch_suffix="a",
        configs_fn=None if config is not None else lambda: [
            *(make_wgmma(f"{name}[{c.name}]", c) for c in ENTRIES),
            *(capped(c, 1, name) for c in ENTRIES if c.mode in PERSISTENT_MODES),
        ],
    )


def capped(config: WgmmaConfig | str, units: int, name: str = "igemm_wgmma") -> Variant:
    """``config`` forced with its grid capped to ``units`` blocks (pairs of blocks for ``cluster``
    and ``cluster_a``), so that on a problem of more tiles than that every block (pair) loops over
    several: the ring's phases run on across tiles, ping-pong's consumers take turns more than once
    and reuse their staging buffers, a cluster pair walks several pair tiles. Named
    ``<name>[<config>]_grid<blocks>``; for the tests and the sanitizers (`MULTI_TILE_PROBLEMS`).

    Raises:
        ValueError: a schedule whose blocks do not loop over tiles (one tile per block), or units < 1.
    """
    cfg = BY_NAME[config] if isinstance(config, str) else config
    if cfg.mode not in PERSISTENT_MODES or units < 1:
        raise ValueError(f"{cfg.name}: only the schedules whose blocks loop over tiles ({', '.join(PERSISTENT_MODES)}) "
                         f"can run on a capped grid, of 1 unit or more; got {units}")
    blocks = units * (CLUSTER if cfg.mode in CLUSTER_MODES else 1)
    v = make_wgmma(f"{name}[{cfg.name}]", cfg)
    ring = lambda p: ring_reason(p, cfg, min(blocks, grid_blocks(p, cfg)))  # noqa: E731 - the capped grid's
    v = replace(v, supports_fn=lambda p, c: problem_reason(p, c) or ring(p))
    return v.with_output_launch(lambda launch: replace(launch, grid=(min(launch.grid[0], blocks), 1, 1)),
                                name=f"{v.name}_grid{blocks}")



# ---- the ring, replayed in Python -------------------------------------------------------------
# The kernel's programs (one_warpgroup, produce, consume) as Python generators over a model
# mbarrier, interleaved by a seeded random scheduler with the asynchronous parts (a copy lands, a
# wgmma group retires), as day 12's `replay` does for cp.async. Day 16's notebook draws the one
# warpgroup's ring with it, day 17's replays every schedule and plants the classic mistakes.


class RingHazard(Exception):
    """A rule of the ring broken in a replayed schedule (the message says which)."""


class Mbarrier:
    """An mbarrier as the kernel uses it: a phase completes when ``count`` arrivals and every byte
    announced with expect_tx are in; ``passed(parity)`` is the wait of ``mbar_wait(bar, parity)``:
    true while the current phase's parity differs from ``parity`` (that phase has completed)."""

    def __init__(self, name: str, count: int):
        self.name, self.count, self.pending, self.tx, self.phase = name, count, count, 0, 0

    def arrive(self, n: int = 1) -> None:
        if n > self.pending:
            raise RingHazard(f"{self.name}: {n} arrivals on a phase that expects {self.pending} more")
        self.pending -= n
        self._complete()

    def expect_tx(self, nbytes: int) -> None:
        """mbarrier.arrive.expect_tx: announce the bytes, then arrive once."""
        self.tx += nbytes
        self.arrive()

    def complete_tx(self, nbytes: int) -> None:
        """A copy landing: its bytes count off."""
        self.tx -= nbytes
        self._complete()

    def _complete(self) -> None:
        if self.pending == 0 and self.tx == 0:
            self.phase, self.pending = self.phase + 1, self.count

    def passed(self, parity: int) -> bool:
        return (self.phase & 1) != parity


# The mistakes `replay_ring` can plant (``bug=``), each a classic of mbarrier rings.
RING_BUGS = {
    "early arrive": "a consumer arrives on empty[s] as soon as it issues its wgmma, before wgmma.wait_group",
    "full parity": "consumers wait on full[s] with parity (u / STAGES + 1) & 1",
    "empty parity": "the producer waits on empty[s] with parity (u / STAGES) & 1",
    "empty count": "empty[s] initialised for one warpgroup's 4 arrivals with 2 consumers",
    "no order wait": "ping-pong: a consumer starts its next tile without waiting on its order barrier",
}


def replay_ring(mode: str, stages: int, steps: int | Sequence[int], tiles: int = 1, consumers: int = 2,
                bm: int = 128, bn: int = 128, seed: int = 0, bug: str | None = None, trace: list | None = None,
                slow_copies: float = 1.0) -> int:
    """Replay one block's ring under one random interleaving (``seed``); return the events run.

    ``steps``: GEMM-K steps per tile, or (specialised / persistent) one count per tile of the
    block, ``tiles`` of them (day 22's split items, whose step ranges differ).
    ``mode``: "one_wg", one warpgroup that issues its copies STAGES - 1 steps ahead between its
    own wgmma steps (one tile, as `one_warpgroup`); "specialised" / "persistent", a producer and
    ``consumers`` consumer warpgroups over ``tiles`` tiles, the ring's uses counted across tiles,
    every consumer reading every slot (its rows of A, all of B: `produce`, `consume`);
    "pingpong", two consumers taking the block's tiles in turn, each use read by one, their main
    loops ordered by order[0], order[1] as in the kernel. A copy lands, and a committed wgmma
    group retires, at any later moment; with ``slow_copies`` < 1 a landing is picked that much less
    often than the other events (copies linger). ``bug``: a key of `RING_BUGS`. ``trace``, if
    given, collects (event number, "copy" | "land" | "read" | "retire", slot, use).

    Raises:
        RingHazard: a copy into a slot a wgmma still reads, a refill before every consumer read
            the slot, a wgmma on a slot without its step or its bytes, more arrivals than a phase
            expects, a deadlock, or a step never read by every consumer.
    """
    if bug is not None and bug not in RING_BUGS:
        raise ValueError(f"bug must be one of {', '.join(RING_BUGS)}; got {bug!r}")
    one, ping = mode == "one_wg", mode == "pingpong"
    if not isinstance(steps, int):
        if one or ping or len(steps) != tiles or min(steps) < 1:
            raise ValueError(f"steps per tile ({list(steps)}): one count >= 1 per tile, specialised or persistent")
    per_tile = [steps] * tiles if isinstance(steps, int) else list(steps)
    groups = 1 if one else consumers
    readers = 1 if one or ping else consumers  # consumer warpgroups that read each use of a slot
    rng = random.Random(seed)
    full = [Mbarrier(f"full[{s}]", 1) for s in range(stages)]
    empty = [Mbarrier(f"empty[{s}]", 4 * (1 if bug == "empty count" else readers)) for s in range(stages)]
    order = [Mbarrier(f"order[{g}]", 1) for g in range(2)]
    total = sum(per_tile)
    holds, landing, reading = [None] * stages, [0] * stages, [Counter() for _ in range(stages)]
    done = defaultdict(set)  # use -> consumers whose wgmma on it retired
    copies, mma = [], {g: deque() for g in range(groups)}

    def issue(u):  # issue_step: one arrival with the bytes, then the im2col copy of A and the tiled copy of B
        s = u % stages
        yield ("expect_tx", full[s], (bm + bn) * ROW_BYTES)
        yield ("copy", s, u, full[s], bm * ROW_BYTES)
        yield ("copy", s, u, full[s], bn * ROW_BYTES)

    def full_parity(u):
        return ((u // stages) + (bug == "full parity")) & 1

    def empty_parity(u):  # the refill of use u waits for the phase of use u - STAGES
        return ((u // stages) - (bug != "empty parity")) & 1

    def one_wg():
        for t in range(min(stages - 1, total)):
            yield from issue(t)
        for t in range(total):
            s = t % stages
            yield ("wait", full[s], full_parity(t))
            yield ("mma", 0, s, t)
            if bug == "early arrive":
                yield ("arrive", empty[s], 4)
            yield ("mma_wait", 0, 1)
            if t > 0 and bug != "early arrive":
                yield ("arrive", empty[(t - 1) % stages], 4)
            nxt = t + stages - 1
            if nxt < total:
                if nxt >= stages:
                    yield ("wait", empty[nxt % stages], empty_parity(nxt))
                yield from issue(nxt)
        yield ("mma_wait", 0, 0)

    def producer():
        for u in range(total):
            if u >= stages:
                yield ("wait", empty[u % stages], empty_parity(u))
            yield from issue(u)

    def pingpong_consumer(g):  # this consumer's tiles are g, g + 2, ... of the block
        u = g * steps
        for n, _tile in enumerate(range(g, tiles, 2)):
            if (g == 1 or n > 0) and bug != "no order wait":
                yield ("wait", order[g], (n - (g == 0)) & 1)
            for t in range(steps):
                s = u % stages
                yield ("wait", full[s], full_parity(u))
                yield ("mma", g, s, u)
                yield ("mma_wait", g, 1)
                if t > 0:
                    yield ("arrive", empty[(u - 1) % stages], 4)
                u += 1
            yield ("arrive", order[1 - g], 1)  # the other consumer's turn
            yield ("mma_wait", g, 0)
            yield ("arrive", empty[(u - 1) % stages], 4)
            u += steps  # the slot uses of the other consumer's tile

    def consumer(g):
        u = 0
        for tile in range(tiles):
            for t in range(per_tile[tile]):
                s = u % stages
                yield ("wait", full[s], full_parity(u))
                yield ("mma", g, s, u)
                if bug == "early arrive":
                    yield ("arrive", empty[s], 4)
                yield ("mma_wait", g, 1)
                if t > 0 and bug != "early arrive":
                    yield ("arrive", empty[(u - 1) % stages], 4)
                u += 1
            yield ("mma_wait", g, 0)
            if bug != "early arrive":
                yield ("arrive", empty[(u - 1) % stages], 4)

    program = pingpong_consumer if ping else consumer
    actors = ({"warpgroup": one_wg()} if one else
              {"producer": producer(), **{f"consumer {g}": program(g) for g in range(groups)}})
    nxt = {a: next(gen, None) for a, gen in actors.items()}
    events = 0
    while True:
        ready = [("run", a) for a, op in nxt.items() if op is not None
                 and not (op[0] == "wait" and not op[1].passed(op[2]))
                 and not (op[0] == "mma_wait" and len(mma[op[1]]) > op[2])]
        weights = [1.0] * len(ready) + [slow_copies] * len(copies) + [1.0] * sum(bool(q) for q in mma.values())
        ready += [("land", i) for i in range(len(copies))] + [("retire", g) for g in mma if mma[g]]
        if not ready:
            stuck = {a: op for a, op in nxt.items() if op is not None}
            if stuck:
                raise RingHazard("deadlock: " + "; ".join(f"{a} waits on {op[1].name if op[0] == 'wait' else 'wgmma'}"
                                                          for a, op in stuck.items()))
            break
        kind, who = rng.choices(ready, weights)[0]
        events += 1
        if kind == "land":
            s, u, bar, nbytes = copies.pop(who)
            landing[s] -= 1
            bar.complete_tx(nbytes)
            if trace is not None:
                trace.append((events, "land", s, u))
            continue
        if kind == "retire":
            s, u = mma[who].popleft()
            reading[s][who] -= 1
            done[u].add(who)
            if trace is not None:
                trace.append((events, "retire", s, u))
            continue
        op = nxt[who]
        if op[0] == "arrive":
            op[1].arrive(op[2])
        elif op[0] == "expect_tx":
            op[1].expect_tx(op[2])
        elif op[0] == "copy":
            _, s, u, bar, nbytes = op
            if sum(reading[s].values()):
                raise RingHazard(f"the copy of step {u} into slot {s} while a wgmma still reads step {holds[s]} there")
            if holds[s] is not None and holds[s] != u and len(done[holds[s]]) < readers:
                raise RingHazard(f"the copy of step {u} overwrites slot {s} before every consumer read step {holds[s]}")
            holds[s] = u
            landing[s] += 1
            copies.append((s, u, bar, nbytes))
            if trace is not None:
                trace.append((events, "copy", s, u))
        elif op[0] == "mma":
            _, g, s, u = op
            if holds[s] != u or landing[s]:
                what = f"holds step {holds[s]}" if holds[s] != u else "is still being written"
                raise RingHazard(f"consumer {g}'s wgmma reads step {u} from slot {s}, which {what}")
            reading[s][g] += 1
            mma[g].append((s, u))
            if trace is not None:
                trace.append((events, "read", s, u))
        nxt[who] = next(actors[who], None)
    missing = [u for u in range(total) if len(done[u]) < readers]
    if missing:
        raise RingHazard(f"steps {missing[:4]} were never read by every consumer")
    return events


def ring_spans(trace: list) -> dict[tuple[int, int], dict[str, tuple[int, int]]]:
    """A `replay_ring` trace as spans on its event clock, per (slot, use): "copy in flight" (the
    first copy issued to the last landed), "landed, waiting" (to the first wgmma read) and "read by
    wgmma" (to the last retire: every consumer done)."""
    first, last = defaultdict(dict), defaultdict(dict)
    for ev, what, s, u in trace:
        first[(s, u)].setdefault(what, ev)
        last[(s, u)][what] = ev
    return {k: {"copy in flight": (first[k]["copy"], last[k]["land"]),
                "landed, waiting": (last[k]["land"], first[k]["read"]),
                "read by wgmma": (first[k]["read"], last[k]["retire"])} for k in first}


def schedule_timeline(mode: str, tiles: int, mainloop: float,
                      epilogue: float) -> list[tuple[str, str, int, float, float]]:
    """A schematic of one block's two consumer warpgroups over its ``tiles`` tiles, as spans
    (consumer, "main loop" | "epilogue", tile, start, end), for day 17's picture. Assumed, not
    measured: one main loop at a time keeps the tensor cores busy and takes ``mainloop`` per tile
    however it is split; storing a whole tile takes one warpgroup ``epilogue``; the producer keeps
    the ring full. "persistent": both consumers run each tile's main loop (half the rows each),
    then both store their halves (``epilogue`` / 2), and only then start the next tile.
    "pingpong": consumer g takes tiles g, g + 2, ...; a main loop starts when the previous tile's
    has ended (the order barrier) and its consumer has stored its previous tile."""
    if mode not in ("persistent", "pingpong"):
        raise ValueError(f"mode must be 'persistent' or 'pingpong'; got {mode!r}")
    spans, t0 = [], 0.0
    if mode == "persistent":
        for t in range(tiles):
            for g in range(2):
                spans += [(f"consumer {g}", "main loop", t, t0, t0 + mainloop),
                          (f"consumer {g}", "epilogue", t, t0 + mainloop, t0 + mainloop + epilogue / 2)]
            t0 += mainloop + epilogue / 2
        return spans
    free = [0.0, 0.0]  # when each consumer has stored its last tile
    for t in range(tiles):
        g = t % 2
        start = max(t0, free[g])
        spans += [(f"consumer {g}", "main loop", t, start, start + mainloop),
                  (f"consumer {g}", "epilogue", t, start + mainloop, start + mainloop + epilogue)]
        t0, free[g] = start + mainloop, start + mainloop + epilogue
    return spans


register(make_wgmma())


# ---- day 15's search space: the compiled entries (schedule x tile) x the tile order --------------

SPACE_VARIANT = "igemm_wgmma"
CONFIG_NAME = re.compile(r"(\w+?)_(\d+)x(\d+)_c(\d+)_s(\d+)(?:_g(\d+))?")


def parse_config(config: str) -> WgmmaConfig:
    """``"persistent_256x128_c2_s4_g8"`` -> that `WgmmaConfig` (``_g<group_m>`` optional: 1).

    Raises:
        ValueError: not a configuration name, or one the ``.cu`` file does not instantiate.
    """
    m = CONFIG_NAME.fullmatch(config)
    if not m or m.group(1) not in MODES:
        raise ValueError(f"an {SPACE_VARIANT} configuration looks like 'persistent_256x128_c2_s4_g8'; got {config!r}")
    mode, bm, bn, cons, st, g = m.groups()
    cfg = WgmmaConfig(mode, int(bm), int(bn), int(cons), int(st), int(g or 1))
    if cfg.compiled not in ENTRIES:
        raise ValueError(f"{config!r} is not instantiated in {CU_FILE}; it has: {', '.join(BY_NAME)}")
    return cfg


@functools.cache
def space_variant(config: str) -> Variant:
    """The variant forcing a configuration name (one object per name)."""
    return make_wgmma(f"{SPACE_VARIANT}[{config}]", parse_config(config))


def gemm_tile(p: Conv2dProblem, cfg: WgmmaConfig) -> GemmTile:
    """The model's view of ``cfg`` on ``p`` (`helpers.tune.gemm_tile_us`): the GEMM M = N·P·Q,
    N = K, GEMM-K = C·R·S in R·S·ceil(C / 64) steps; a consumer warpgroup's share of the tile as
    the "warp" tile (its wgmma's M x N: wgmma reads its operands from shared memory, so the edge
    cost stands for the operand reads per FLOP); the consumers' setmaxnreg target as registers;
    DRAM: day 13's `dram_bytes` (x as the taps touch it, w, y once)."""
    g = p.gemm
    rows = 64 * cfg.m_tiles
    return GemmTile(m=g.m, n=g.n, k=g.k, bm=cfg.bm, bn=cfg.bn, bk=BK, warp_m=rows, warp_n=cfg.bn,
                    threads=cfg.threads, stages=cfg.stages, shared_bytes=cfg.shared_bytes,
                    regs=setmaxnreg_targets(cfg)[1] or 168, steps=p.R * p.S * cdiv(p.C, BK), dram_bytes=dram_bytes(p))


def space_candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every compiled entry at the problem's tile order (`group_rows`), the model's time each, in
    families by schedule (the model does not see what a schedule hides: ping-pong's epilogue, the
    clusters' shared loads); the rule's pick (`choose`) is the prior."""
    rule, g = choose(p), group_rows(p)
    out = []
    for c in ENTRIES:
        cfg = replace(c, group_m=g)
        out.append(Candidate(cfg.name, space_variant(cfg.name), gemm_tile_us(gemm_tile(p, cfg), machine),
                             cfg == rule, family=cfg.mode))
    return out


def space_variations(config: str, p: Conv2dProblem) -> list[str]:
    """The other tile order: row-major (group_m 1) or groups of `GROUP_M` m-tiles (a kernel
    argument: no new build)."""
    cfg = parse_config(config)
    return [replace(cfg, group_m=GROUP_M if cfg.group_m == 1 else 1).name]


SPACE = register_space(Space(SPACE_VARIANT, space_candidates, space_variations, lambda cfg, p: space_variant(cfg),
                             summary="WGMMA_ENTRY schedules x tiles x tile order"))
