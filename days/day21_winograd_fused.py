"""Day 21: ``winograd_f2_fused`` and ``winograd_f4_fused`` (``kernels/conv2d/21_winograd_fused.cu``),
Winograd F(m x m, 3 x 3) in fp32 on CUDA cores with the input transform, the n² GEMMs and the output
transform in one kernel: no workspace for V or M (the DRAM round trips of day 20's pipeline). Built on
day 20's public names (`days.day20_winograd.pipeline`: the transforms and their ``-D`` defines, the tiles'
`Geometry`, the refusals, the error model); the kernel file shares day 20's ``winograd_transforms.cuh``.

* the block tile (`FusedConfig`, `FUSED_TILES`): BT Winograd tiles x BK filters per block, BC channels
  per chunk of the main loop, and what follows from them (the register tile, the position groups,
  the shared memory), passed to the kernel as ``-D`` defines with day 20's transforms (`fused_defines`);
* the two launches (`fused_launches`): ``filter`` (w -> the blocked U, the only workspace,
  `FusedGeometry`) and ``main`` (x, U -> y), one block per (tile block, filter block);
* refusals before any launch (`fused_reason`): day 20's shape and int32 refusals, the blocked U over
  the workspace limit, the grid past CUDA's 2^31 − 1 blocks;
* what the main kernel writes (`fused_output_writes`, the variant's ``covers_fn``) and the whole run
  on the CPU with the kernels' index arithmetic and loop order (`simulate_fused`), with planted
  faults (a channel chunk dropped, a transform position dropped, an edge tile misplaced);
* the tuner's spaces (day 15) of both variants (`space_candidates`): every block tile (BT, BK, BC) the
  kernel compiles with at most `SPACE_MAX_ACCUMULATORS` accumulators a thread, each its own build;
* the error model: day 20's `winograd_model` unchanged. Each accumulator is one chain over the
  channels in ascending order (chunk by chunk, channel by channel), from 0, of the pipeline's
  transforms: the same roundings as the pipeline (`rounding_depth` counts them), in the same order.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

import numpy as np

from helpers.problem import Conv2dProblem
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import INT32_MAX, MAX_GRID, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .day20_winograd.pipeline import (
    FLOAT_BYTES,
    WORKSPACE_LIMIT,
    Geometry,
    constants_f32,
    gib,
    kernel_defines,
    mul_left,
    mul_right_t,
    shape_reason,
    sizes_int32_reason,
    transform_launch,
    winograd,
    winograd_model,
)
from .kit import cdiv

FUSED_CU_FILE = "21_winograd_fused.cu"
FUSED_THREADS = 256  # the main kernel's block
FUSED_TK = 4  # filters of a thread's register tile
FUSED_KS = 8  # filters per piece of the epilogue (M through shared memory)
SMEM_LIMIT = 48 * 1024  # the kernel's static shared memory stays within what every GPU gives without opt-in
REGISTERED_FUSED_MS = (2, 4)


@dataclass(frozen=True)
class FusedConfig:
    """The fused kernel's block tile for F(m x m, 3 x 3): ``bt`` Winograd tiles x ``bk`` filters
    per block, ``bc`` channels per chunk (the kernel's ``WINOF_BT``, ``WINOF_BK``, ``WINOF_BC``),
    and what the kernel derives from them (its ``constexpr``s, same names in lower case).

    Raises:
        ValueError: a tile the kernel's ``static_assert``s refuse.
    """

    m: int
    bt: int
    bk: int
    bc: int

    def __post_init__(self):
        if self.bt not in (8, 16, 32) or self.bk % FUSED_KS or self.bk < FUSED_KS or self.bc < 1:
            raise ValueError(f"a fused tile needs BT in 8, 16, 32 and BK a multiple of {FUSED_KS}; got {self}")
        if FUSED_THREADS % self.group or self.npos % self.pg:
            raise ValueError(f"{self}: {self.pg} position groups do not divide the {self.npos} positions")
        if self.uchunk % (2 * FUSED_THREADS):
            raise ValueError(f"{self}: a U chunk of {self.uchunk} floats is no whole number of float2s per thread")
        if self.smem_bytes > SMEM_LIMIT:
            raise ValueError(f"{self}: {self.smem_bytes} B of shared memory; the kernel's limit is {SMEM_LIMIT} B")

    @property
    def name(self) -> str:
        return f"{self.bt}x{self.bk}x{self.bc}"

    @property
    def n(self) -> int:
        return self.m + 2

    @property
    def npos(self) -> int:
        return self.n**2

    @property
    def tt(self) -> int:
        """Tiles of a thread's register tile (BT / 8)."""
        return self.bt // 8

    @property
    def tk(self) -> int:
        return FUSED_TK

    @property
    def group(self) -> int:
        """Threads that cover BT x BK for one position: (BT / TT)·(BK / TK)."""
        return (self.bt // self.tt) * (self.bk // self.tk)

    @property
    def pg(self) -> int:
        """Position groups: 256 / group."""
        return FUSED_THREADS // self.group

    @property
    def np_(self) -> int:
        """Positions per thread (the kernel's NP): n² / PG."""
        return self.npos // self.pg

    @property
    def accumulators(self) -> int:
        return self.np_ * self.tt * self.tk

    @property
    def trow(self) -> int:
        """The staging array's pitch of one (channel, tile) row: n + 1, the spare float putting the row
        jobs' reads (tile fastest) in distinct shared-memory banks."""
        return self.n + 1

    @property
    def tcs(self) -> int:
        """The staging array's pitch of one channel: BT·(n + 1) padded up to n (mod 32), spreading the
        column jobs' stores over the banks (conflict-free for F(2) NHWC, 2-way otherwise: the kernel's
        header)."""
        return self.bt * self.trow + ((self.n - self.bt * self.trow) % 32 + 32) % 32

    @property
    def uchunk(self) -> int:
        """Floats of one block's U for one chunk: n²·BC·BK."""
        return self.npos * self.bc * self.bk

    @property
    def npair(self) -> int:
        """(tile, filter) pairs of one epilogue piece: BT·KS."""
        return self.bt * FUSED_KS

    @property
    def smem_bytes(self) -> int:
        """The kernel's static shared memory: max(V + max(U, st), one piece of M), in bytes."""
        v = self.npos * self.bc * self.bt
        st = self.n * self.bc * self.tcs
        return FLOAT_BYTES * max(v + max(self.uchunk, st), self.npos * self.npair)


FUSED_TILES = {2: FusedConfig(2, 32, 32, 8), 4: FusedConfig(4, 16, 32, 4)}


def fused_defines(cfg: FusedConfig) -> dict[str, object]:
    """The ``-D`` defines of ``21_winograd_fused.cu``: day 20's transforms (`kernel_defines`) and the tile."""
    return {**kernel_defines(cfg.m), "WINOF_BT": cfg.bt, "WINOF_BK": cfg.bk, "WINOF_BC": cfg.bc}


@dataclass(frozen=True)
class FusedGeometry:
    """The fused kernel's blocks and its workspace on a problem (day 20's `Geometry` for the tiles).

    chunks = ceil(C / BC), kblocks = ceil(K / BK), tblocks = ceil(T / BT), one block per (tile
    block, filter block): blocks = tblocks·kblocks, block b = tb·kblocks + kb. The workspace is
    the blocked U, Ub[kb][ch][pos][c][k'] (kblocks·chunks·n²·BC·BK floats)."""

    g: Geometry
    cfg: FusedConfig

    @classmethod
    def of(cls, p: Conv2dProblem, cfg: FusedConfig) -> FusedGeometry:
        return cls(Geometry.of(p, cfg.m), cfg)

    @property
    def chunks(self) -> int:
        return cdiv(self.g.C, self.cfg.bc)

    @property
    def kblocks(self) -> int:
        return cdiv(self.g.K, self.cfg.bk)

    @property
    def tblocks(self) -> int:
        return cdiv(self.g.T, self.cfg.bt)

    @property
    def blocks(self) -> int:
        return self.tblocks * self.kblocks

    @property
    def filter_elements(self) -> int:
        """The filter launch's grid-stride loop: one (filter, channel) pair of Ub each."""
        return self.kblocks * self.chunks * self.cfg.bc * self.cfg.bk

    @property
    def ub_elements(self) -> int:
        return self.filter_elements * self.cfg.npos

    @property
    def workspace_bytes(self) -> int:
        return self.ub_elements * FLOAT_BYTES


def main_launch(fg: FusedGeometry) -> LaunchConfig:
    """``winof_main_<layout>``: a 1-D grid of tblocks·kblocks blocks of 256 threads (static shared memory)."""
    return LaunchConfig(grid=(fg.blocks, 1, 1), block=(FUSED_THREADS, 1, 1))


def fused_launches(p: Conv2dProblem, cfg: FusedConfig) -> list[KernelLaunch]:
    """The two launches of a run: ``filter`` (w -> Ub, the workspace) and ``main`` (x, Ub -> y); see
    the kernel file's header for their arguments."""
    fg = FusedGeometry.of(p, cfg)
    g = fg.g
    lay = p.layout.lower()
    i32 = np.int32
    return [
        KernelLaunch("filter", f"winof_filter_{lay}", transform_launch(fg.filter_elements),
                     (Buffer("w"), Buffer("workspace"), i32(g.K), i32(g.C), i32(fg.kblocks), i32(fg.chunks))),
        KernelLaunch("main", f"winof_main_{lay}", main_launch(fg),
                     (Buffer("x"), Buffer("workspace"), Buffer("y"), *(i32(v) for v in (
                         g.N, g.C, g.H, g.W, g.K, g.P, g.Q, g.pad_h, g.pad_w, g.tP, g.tQ, fg.kblocks)))),
    ]


def fused_reason(p: Conv2dProblem, cfg: FusedConfig, limit: int = WORKSPACE_LIMIT) -> str | None:
    """None if ``winograd_f<m>_fused`` runs ``p``, else why not, before any launch: day 20's
    `shape_reason` and `sizes_int32_reason`; the kernel's ints t0 + tile < tblocks·BT, k0 + k' <
    kblocks·BK and ch·BC + c < chunks·BC; the blocked U over ``limit`` bytes; the grid past
    CUDA's 2^31 − 1 blocks. (Shared memory is static and under 48 KB: `FusedConfig` refuses more.)"""
    reason = shape_reason(p)
    if reason:
        return reason
    fg = FusedGeometry.of(p, cfg)
    reason = sizes_int32_reason(fg.g)
    if reason:
        return reason
    for name, v in (("tblocks * BT (the last tile block's tiles)", fg.tblocks * cfg.bt),
                    ("kblocks * BK (the last filter block's filters)", fg.kblocks * cfg.bk),
                    ("chunks * BC (the last chunk's channels)", fg.chunks * cfg.bc)):
        if v > INT32_MAX:
            return f"{name} = {v} does not fit the kernels' int32 (at most {INT32_MAX})"
    if fg.workspace_bytes > limit:
        return (f"needs {fg.workspace_bytes} bytes ({gib(fg.workspace_bytes)}) of workspace for the blocked U "
                f"(n² = {cfg.npos} positions x {fg.chunks * cfg.bc} channels x {fg.kblocks * cfg.bk} filters); "
                f"the limit is {gib(limit)}")
    if fg.blocks > MAX_GRID[0]:
        return (f"needs {fg.blocks} blocks ({fg.tblocks} tile blocks x {fg.kblocks} filter blocks) on grid x; "
                f"the limit is {MAX_GRID[0]}")
    return None


# ---- what the main kernel writes ------------------------------------------------------------------


def pair_decode(cfg: FusedConfig, nhwc: bool, pair: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(tile, kk) of an epilogue pair: NHWC pair = tile·KS + kk, NCHW pair = kk·BT + tile."""
    return (pair // FUSED_KS, pair % FUSED_KS) if nhwc else (pair % cfg.bt, pair // cfg.bt)


def block_pair_writes(cfg: FusedConfig, nhwc: bool) -> np.ndarray:
    """Writes per (tile, filter) of one block (BT x BK) by the epilogue's loops: piece s, then the
    pairs of the piece, each one (tile, s·KS + kk)."""
    counts = np.zeros((cfg.bt, cfg.bk), dtype=np.int64)
    tile, kk = pair_decode(cfg, nhwc, np.arange(cfg.npair))
    for piece in range(cfg.bk // FUSED_KS):
        np.add.at(counts, (tile, piece * FUSED_KS + kk), 1)
    return counts


def tile_of_pixels(g: Geometry) -> np.ndarray:
    """The tile t = (n·tP + p / m)·tQ + q / m of every output pixel, shape (N, P, Q)."""
    n = np.arange(g.N)[:, None, None]
    pp = np.arange(g.P)[None, :, None] // g.m
    qq = np.arange(g.Q)[None, None, :] // g.m
    return (n * g.tP + pp) * g.tQ + qq


def fused_output_writes(p: Conv2dProblem, cfg: FusedConfig, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element of y (flat, the problem's layout) by ``winof_main_<layout>`` on ``launch``
    (default `main_launch`): block (x, y, z) computes block b = x (tile block b / kblocks, filter block
    b % kblocks), its epilogue writes each (tile, filter) pair of `block_pair_writes` below T and K,
    and a pair writes the pixels of its tile inside P x Q (one each)."""
    fg = FusedGeometry.of(p, cfg)
    g = fg.g
    launch = launch or main_launch(fg)
    gx, gy, gz = launch.grid
    visits = np.zeros(max(gx, fg.blocks), dtype=np.int64)
    visits[:gx] += gy * gz
    visits = visits[: fg.blocks].reshape(fg.tblocks, fg.kblocks)
    local = block_pair_writes(cfg, g.layout == "NHWC")
    t, k = np.arange(g.T)[:, None], np.arange(g.K)[None, :]
    per_tk = visits[t // cfg.bt, k // cfg.bk] * local[t % cfg.bt, k % cfg.bk]  # (T, K)
    tix = tile_of_pixels(g)
    if g.nchw:
        counts = per_tk[tix[:, None, :, :], np.arange(g.K)[None, :, None, None]]
    else:
        counts = per_tk[tix[..., None], np.arange(g.K)[None, None, None, :]]
    return counts.ravel()


# ---- the whole run on the CPU, by the kernels' index arithmetic and loop order ----------------------


def _gather(src: np.ndarray, idx: np.ndarray, ok: np.ndarray, dtype) -> np.ndarray:
    return np.where(ok, src[np.where(ok, idx, 0)], dtype(0))


def simulate_filter(p: Conv2dProblem, w: np.ndarray, cfg: FusedConfig, dtype=np.float64) -> np.ndarray:
    """``winof_filter_<layout>`` on the CPU: the blocked U (flat), element i = ((kb·chunks + ch)·BC
    + c)·BK + k' of the grid-stride loop writing U[pos] of (k, channel) at (i / (BC·BK))·n²·BC·BK +
    pos·BC·BK + c·BK + k'; NaN where nothing writes."""
    fg = FusedGeometry.of(p, cfg)
    g = fg.g
    _, gm, _ = constants_f32(winograd(cfg.m)) if dtype == np.float32 else winograd(cfg.m).arrays(np.float64)
    wf = np.ascontiguousarray(w, dtype=dtype).ravel()
    i = np.arange(fg.filter_elements, dtype=np.int64)
    kq, c, blk = i % cfg.bk, i // cfg.bk % cfg.bc, i // (cfg.bk * cfg.bc)
    ch, kb = blk % fg.chunks, blk // fg.chunks
    k, cg = kb * cfg.bk + kq, ch * cfg.bc + c
    ok = (k < g.K) & (cg < g.C)
    r3 = 3
    gt = np.empty((i.size, r3, r3), dtype=dtype)
    for r in range(r3):
        for s in range(r3):
            off = (k * r3 * r3 + r * r3 + s) * g.C + cg if not g.nchw else ((k * g.C + cg) * r3 + r) * r3 + s
            gt[:, r, s] = _gather(wf, off, ok, dtype)
    u = mul_right_t(mul_left(gm, gt), gm)
    ub = np.full(fg.ub_elements, np.nan, dtype=dtype)
    dst = blk * cfg.uchunk + c * cfg.bk + kq
    for xi in range(cfg.n):
        for nu in range(cfg.n):
            ub[dst + (xi * cfg.n + nu) * cfg.bc * cfg.bk] = u[:, xi, nu]
    return ub


def simulate_fused(p: Conv2dProblem, x: np.ndarray, w: np.ndarray, m: int, dtype=np.float64,
                   cfg: FusedConfig | None = None, launch: LaunchConfig | None = None,
                   drop_chunk: int | None = None, drop_position: int | None = None,
                   edge_fault: bool = False) -> np.ndarray:
    """The two kernels of a fused run on the CPU, block by block (each block's threads vectorised),
    with the kernels' index arithmetic and loop order: the filter launch into the blocked U
    (`simulate_filter`), then per block (``launch``'s grid, default `main_launch`) and chunk: the
    column jobs (tile, c, b) into the staging array st (its padded pitches), the row jobs (tile, c,
    i) into V[pos][c][tile], the chunk's U copied, the accumulators updated channel by channel;
    then per epilogue piece, each thread's accumulators stored where the kernel stores them and
    each pair's output transform written to its pixels. Shared arrays start NaN, and so does y: a
    pixel never written stays NaN, and a read of something never written spreads NaN to y. Returns
    y in the problem's layout.

    Args:
        dtype: float64 (the index arithmetic, against torch) or float32 (products and sums rounded
            apart: more roundings than the kernel's fmaf, within `winograd_model`'s bound).
        drop_chunk: a planted fault: this chunk's channels are not added.
        drop_position: a planted fault: this transform position's products are not added.
        edge_fault: a planted fault: the last tile of each tile row (tw = tQ − 1) writes its pixels
            one tile to the left.
    """
    cfg = cfg or FUSED_TILES[m]
    if cfg.m != m:
        raise ValueError(f"a fused tile for F({cfg.m}) cannot run F({m})")
    fg = FusedGeometry.of(p, cfg)
    g = fg.g
    launch = launch or main_launch(fg)
    n, npos, ks = cfg.n, cfg.npos, FUSED_KS
    at, _, bt = constants_f32(winograd(m)) if dtype == np.float32 else winograd(m).arrays(np.float64)
    xf = np.ascontiguousarray(x, dtype=dtype).ravel()
    ub = simulate_filter(p, w, cfg, dtype)
    y = np.full(p.y_numel, np.nan, dtype=dtype)
    nhwc = not g.nchw

    jobs = np.arange(cfg.bt * cfg.bc * n)
    if nhwc:  # the column jobs: NHWC c fastest, then b, then tile; NCHW b, then tile, then c
        c1, b1, tile1 = jobs % cfg.bc, jobs // cfg.bc % n, jobs // (cfg.bc * n)
    else:
        b1, tile1, c1 = jobs % n, jobs // n % cfg.bt, jobs // (n * cfg.bt)
    tile2, c2, i2 = jobs % cfg.bt, jobs // cfg.bt % cfg.bc, jobs // (cfg.bt * cfg.bc)  # the row jobs
    tid = np.arange(FUSED_THREADS)
    grp, pg = tid % cfg.group, tid // cfg.group
    tt, tk = grp % (cfg.bt // cfg.tt), grp // (cfg.bt // cfg.tt)

    def origin(t: np.ndarray, ph: int, pw: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        img, rem = t // (g.tP * g.tQ), t % (g.tP * g.tQ)
        th, tw = rem // g.tQ, rem % g.tQ
        return img, th * m - ph, tw * m - pw, tw

    for bid in range(launch.grid[0]):
        kb, tb = bid % fg.kblocks, bid // fg.kblocks
        t0, k0 = tb * cfg.bt, kb * cfg.bk
        acc = np.zeros((npos, cfg.bt, cfg.bk), dtype=dtype)  # [pos][tile][filter]: every thread's, by place
        for ch in range(fg.chunks):
            # 1. columns: B^T d[:, b] into st[i][c][tile (n + 1) + b]
            st = np.full((n, cfg.bc, cfg.tcs), np.nan, dtype=dtype)
            t, cg = t0 + tile1, ch * cfg.bc + c1
            inn = (t < g.T) & (cg < g.C)
            img, h0, w0, _ = origin(np.where(inn, t, 0), g.pad_h, g.pad_w)
            ww = w0 + b1
            col_in = inn & (ww >= 0) & (ww < g.W)
            d = np.empty((jobs.size, n, 1), dtype=dtype)
            for a in range(n):
                h = h0 + a
                off = ((img * g.H + h) * g.W + ww) * g.C + cg if nhwc else ((img * g.C + cg) * g.H + h) * g.W + ww
                d[:, a, 0] = _gather(xf, off, col_in & (h >= 0) & (h < g.H), dtype)
            col = mul_left(bt, d)
            for i in range(n):
                st[i, c1, tile1 * cfg.trow + b1] = col[:, i, 0]
            # 2. rows: (row i of st) B into V[i n + j][c][tile]
            row = np.stack([st[i2, c2, tile2 * cfg.trow + ll] for ll in range(n)], axis=-1)[:, None, :]
            v = mul_right_t(row, bt)
            sv = np.full((npos, cfg.bc, cfg.bt), np.nan, dtype=dtype)
            for jj in range(n):
                sv[i2 * n + jj, c2, tile2] = v[:, 0, jj]
            # 3. the chunk's U, as it lies in the workspace
            su = ub[(kb * fg.chunks + ch) * cfg.uchunk:][: cfg.uchunk].reshape(npos, cfg.bc, cfg.bk)
            # 4. the GEMM, channel by channel
            if ch == drop_chunk:
                continue
            for c in range(cfg.bc):
                prod = (sv[:, c, :, None] * su[:, c, None, :]).astype(dtype)
                if drop_position is not None:
                    prod[drop_position] = 0
                acc = (acc + prod).astype(dtype)
        # the epilogue, piece by piece
        for piece in range(cfg.bk // ks):
            sm = np.full((npos, cfg.npair), np.nan, dtype=dtype)
            mine = tk * cfg.tk // ks == piece
            for j in range(cfg.np_):
                for a1 in range(cfg.tt):
                    for a2 in range(cfg.tk):
                        pos, tile, kq = (pg + cfg.pg * j)[mine], (tt * cfg.tt + a1)[mine], (tk * cfg.tk + a2)[mine]
                        kk = kq - piece * ks
                        pair = tile * ks + kk if nhwc else kk * cfg.bt + tile
                        sm[pos, pair] = acc[pos, tile, kq]
            pairs = np.arange(cfg.npair)
            tile, kk = pair_decode(cfg, nhwc, pairs)
            t, k = t0 + tile, k0 + piece * ks + kk
            ok = (t < g.T) & (k < g.K)
            mt = sm.T.reshape(cfg.npair, n, n)
            yt = mul_right_t(mul_left(at, mt), at)
            img, oh, ow, tw = origin(np.where(ok, t, 0), 0, 0)
            if edge_fault:
                ow = np.where(tw == g.tQ - 1, ow - m, ow)
            for a in range(m):
                for b in range(m):
                    pp, qq = oh + a, ow + b
                    inside = ok & (pp < g.P) & (qq < g.Q) & (qq >= 0)
                    flat = ((img * g.P + pp) * g.Q + qq) * g.K + k if nhwc else ((img * g.K + k) * g.P + pp) * g.Q + qq
                    y[flat[inside]] = yt[inside, a, b]
    return y.reshape(p.y_shape)


# ---- the variants -------------------------------------------------------------------------------


def make_winograd_fused(m: int, name: str | None = None, tile: FusedConfig | None = None) -> Variant:
    """The fused day-21 variant for F(m x m, 3 x 3) (not registered): ``winograd_f<m>_fused`` with
    the tile of `FUSED_TILES` (or ``tile``).

    Raises:
        KeyError: an m without a tile in `FUSED_TILES` and no ``tile``.
    """
    cfg = tile or FUSED_TILES[m]
    name = name or f"winograd_f{m}_fused"
    return Variant(
        name=name,
        day=21,
        cu_file=FUSED_CU_FILE,
        summary=f"Winograd F({m}x{m}, 3x3), fp32 on CUDA cores, fused: input transform, {(m + 2) ** 2} GEMMs and "
        f"output transform in one kernel ({cfg.bt} tiles x {cfg.bk} filters a block, {cfg.bc} channels a step), "
        "after a filter transform",
        config_fn=lambda p: cfg,
        supports_fn=lambda p, c: fused_reason(p, c),
        launches_fn=lambda p, epilogue, c: fused_launches(p, c),
        covers_fn=lambda p, launch, c: fused_output_writes(p, c, launch),
        workspace_fn=lambda p, c: FusedGeometry.of(p, c).workspace_bytes,
        defines=fused_defines(cfg),
        layouts=("NCHW", "NHWC"),
        dtypes=("fp32",),
        accum="fp32",
        error_model=winograd_model(m),
    )


WINOGRAD_FUSED = {m: register(make_winograd_fused(m)) for m in REGISTERED_FUSED_MS}

# The main loop's steps a timing experiment can leave out (``WINOF_SKIP``'s bits in the ``.cu`` file).
SKIPPABLE = {"input": 1, "U": 2, "GEMM": 4}


def skipping(v: Variant, *steps: str) -> Variant:
    """``v`` (a fused variant) built with the main loop's ``steps`` left out (`SKIPPABLE`: "input" =
    x's loads and the input transform, "U" = U's copy, "GEMM"), named ``<v>[no <steps>]``: a timing
    experiment, whose output is wrong (day 21, section 5 times its main launch alone).

    Raises:
        ValueError: no step, or one not in `SKIPPABLE`.
    """
    if not steps or not set(steps) <= set(SKIPPABLE):
        raise ValueError(f"steps to leave out: one or more of {', '.join(SKIPPABLE)}; got {steps}")
    mask = sum(SKIPPABLE[s] for s in set(steps))
    return replace(v, name=f"{v.name}[no {' + '.join(sorted(set(steps)))}]", defines={**v.defines, "WINOF_SKIP": mask})


# ---- the tuner's spaces (day 15) -------------------------------------------------------------------

# The block tiles a search may build, before `FusedConfig` refuses some: BT tiles x BK filters x BC channels.
SPACE_GRID = ((8, 16, 32), (8, 16, 32, 64), (1, 2, 4, 8, 16))
# A thread's accumulators at most (the kernel's __launch_bounds__(256, 2) gives it 128 registers). Read from
# nvcc 13.0's ptxas for sm_90 over the whole grid: with 64 (F(2)) or 72 (F(4)) accumulators no tile spills
# but F(4) 8 x 64 x 4 (52 bytes); with 128 or more every tile spills 350-2,700 bytes.
SPACE_MAX_ACCUMULATORS = 72


@functools.cache
def space_tiles(m: int) -> tuple[FusedConfig, ...]:
    """Every tile of `SPACE_GRID` that `FusedConfig` accepts for F(m) with at most
    `SPACE_MAX_ACCUMULATORS` accumulators a thread (F(2): 41, F(4): 5)."""
    out = []
    for bt, bk, bc in itertools.product(*SPACE_GRID):
        try:
            cfg = FusedConfig(m, bt, bk, bc)
        except ValueError:
            continue
        if cfg.accumulators <= SPACE_MAX_ACCUMULATORS:
            out.append(cfg)
    return tuple(out)


def parse_space_config(m: int, config: str) -> FusedConfig:
    """``"16x32x4"`` -> FusedConfig(m, 16, 32, 4) (BT x BK x BC).

    Raises:
        ValueError: not ``<BT>x<BK>x<BC>``, or a tile the kernel refuses.
    """
    try:
        bt, bk, bc = (int(v) for v in config.split("x"))
    except ValueError:
        raise ValueError(f"a fused Winograd tile is named like '16x32x4' (BT x BK x BC); got {config!r}") from None
    return FusedConfig(m, bt, bk, bc)


@functools.cache
def space_variant(m: int, config: str) -> Variant:
    """``winograd_f<m>_fused`` built with the tile ``config`` (one object per name)."""
    return make_winograd_fused(m, f"winograd_f{m}_fused[{config}]", parse_space_config(m, config))


def main_gemm_tile(p: Conv2dProblem, cfg: FusedConfig) -> GemmTile:
    """The model's view of the main kernel on ``p`` as one GEMM on CUDA cores: GEMM-M = the tiles T,
    GEMM-N = K, GEMM-K = n²·C (each chunk a step of n²·BC), one block per BT x BK; a warp holds 8
    tile threads x 4 filter threads (`GemmThread`), so its tile is BT x min(BK, 16); the shared
    memory of `FusedConfig.smem_bytes`; registers the accumulators plus about 48, capped at 128;
    DRAM: x, y and the blocked U once each. Its L2 term reads V (what each block makes from x) once per
    filter block and U once per tile block; the transforms' arithmetic is not counted."""
    fg = FusedGeometry.of(p, cfg)
    g = fg.g
    dram = FLOAT_BYTES * (p.x_numel + p.y_numel + fg.ub_elements)
    return GemmTile(m=g.T, n=g.K, k=cfg.npos * g.C, bm=cfg.bt, bn=cfg.bk, bk=cfg.npos * cfg.bc, warp_m=cfg.bt,
                    warp_n=min(cfg.bk, 4 * FUSED_TK), threads=FUSED_THREADS, stages=2,
                    shared_bytes=cfg.smem_bytes, regs=min(128, cfg.accumulators + 48), steps=fg.chunks,
                    dram_bytes=dram, element_bytes=FLOAT_BYTES, cuda_cores=True)


def space_candidate_us(p: Conv2dProblem, cfg: FusedConfig, machine: Machine) -> float:
    """Predicted µs of a run: the filter transform (w read, the blocked U written) at the DRAM rate
    and its launch, plus the main kernel's `gemm_tile_us` (`main_gemm_tile`)."""
    fg = FusedGeometry.of(p, cfg)
    filt = FLOAT_BYTES * (p.w_numel + fg.ub_elements)
    return filt / (machine.dram_gbps * 1e3) + machine.launch_us + gemm_tile_us(main_gemm_tile(p, cfg), machine)


def space_candidates(m: int, p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every tile of `space_tiles` that runs ``p`` (`fused_reason`), the model's time each, in
    families by block shape (BT x BK); `FUSED_TILES`'s tile is the prior."""
    return [Candidate(cfg.name, space_variant(m, cfg.name), space_candidate_us(p, cfg, machine),
                      cfg == FUSED_TILES[m], family=f"{cfg.bt}x{cfg.bk}")
            for cfg in space_tiles(m) if fused_reason(p, cfg) is None]


FUSED_SPACES = {
    m: register_space(Space(f"winograd_f{m}_fused", functools.partial(space_candidates, m), lambda config, p: [],
                            lambda config, p, m=m: space_variant(m, config),
                            summary="the fused kernel's block tile BT x BK x BC (a build each)"))
    for m in REGISTERED_FUSED_MS
}
