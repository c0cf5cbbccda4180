"""Day 12: ``igemm_pipelined``, tensor-core implicit GEMM with a cp.async multistage pipeline.

``kernels/conv2d/12_igemm_pipelined.cu`` is day 11's mma.sync kernel (m16n8k16, ldmatrix,
XOR-swizzled shared memory, fp32 accumulation, NHWC fp16/bf16) with four additions, each a
parameter here:

* **tile descriptions** (`TileDescription`): block tile BM x BN x BK, WGM x WGN warps, pipeline
  stages, instruction shape. `TileDescription.reason` refuses an invalid one with the reason
  (e.g. a warp tile that is not a multiple of the 16 x 8 instruction, more shared memory than a
  block may have, or a description the ``.cu`` file does not instantiate);
* **input iterators** (`ITERATORS`): ``optimized`` (C % 8 == 0 and R, S <= 16: 16-byte cp.async,
  per-row offsets and tap masks precomputed), ``analytic`` (any C: every element decoded with divisions) and
  ``few_channels`` (C <= 8: GEMM-K packed across taps, one decode per 8-element chunk);
* **threadblock swizzle** (``swizzle`` = log2 of the filter tiles visited by consecutive blocks);
* **epilogue** D = act(alpha·conv(x, w) + beta·Cin + bias), act = identity or ReLU
  (`helpers.check.Epilogue`; `prepare_fused` launches it).

`choose` picks all three per problem (`choose_iterator`, `choose_tile`, `choose_swizzle`);
`make_pipelined` builds a variant with any of them forced, and the registered ``igemm_pipelined``
is the automatic one.

Sources: the PTX ISA ("cp.async", "cp.async.wait_group", "mma.sync m16n8k16", "ldmatrix");
NVIDIA CUTLASS, ``docs/implicit_gemm_convolution.md`` (analytic / optimized / few-channels
iterators, threadblock swizzle ``GemmIdentityThreadblockSwizzle``, ``LinearCombinationRelu``
epilogue) and ``docs/efficient_gemm.md`` (software pipelining through shared memory).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from .check import Epilogue
from .igemm import int32_reason
from .mma import MIN_CC
from .problem import Conv2dProblem
from .variants import INT32_MAX, LaunchConfig, UnsupportedProblem, Variant, _validate, register

CU_FILE = "12_igemm_pipelined.cu"
INSTRUCTION = (16, 8, 16)  # mma.sync m16n8k16: the only instruction shape of the kernel
ITERATORS = ("analytic", "optimized", "few_channels")
VEC_ALIGN = 16  # bytes: cp.async chunks (optimized); the 16-byte stores of y and reads of Cin (K % 8 == 0)
MAX_SMEM_PER_BLOCK = 227 * 1024  # the largest opt-in of sm_80..sm_120 (H100/H200); `prepare` asks the device
FEW_CHANNELS_MAX_C = 8
MAX_MASKED_TAPS = 16  # optimized: one bit per filter row (bits 0..15) and column (16..31) per A row


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class TileDescription:
    """One configuration of the kernel: block tile ``bm`` x ``bn`` x ``bk`` (GEMM-M pixels x GEMM-N
    filters x GEMM-K per pipeline step), ``warps_m`` x ``warps_n`` warps, ``stages`` shared-memory
    stages, ``min_blocks`` the resident blocks per SM asked of ptxas (``__launch_bounds__``: it caps
    registers at 65536 / (threads · min_blocks)), ``instruction`` the mma shape (M, N, K).

    Constructing one checks nothing; `reason` says what is wrong with it, if anything.
    """

    bm: int
    bn: int
    bk: int
    warps_m: int
    warps_n: int
    stages: int
    min_blocks: int = 1
    instruction: tuple[int, int, int] = INSTRUCTION

    @classmethod
    def parse(cls, name: str) -> TileDescription:
        """``"128x128x32_w2x2_s4_b1"`` -> ``TileDescription(128, 128, 32, 2, 2, 4, 1)``; without the
        ``_b`` part, min_blocks = 1.

        Raises:
            ValueError: the name does not have that form.
        """
        m = re.fullmatch(r"(\d+)x(\d+)x(\d+)_w(\d+)x(\d+)_s(\d+)(?:_b(\d+))?", name)
        if not m:
            raise ValueError(
                f"a tile name looks like '128x128x32_w2x2_s4_b1' (BMxBNxBK_wWMxWN_sSTAGES_bMINBLOCKS); got {name!r}"
            )
        return cls(*(int(g) for g in m.groups() if g is not None))

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_w{self.warps_m}x{self.warps_n}_s{self.stages}_b{self.min_blocks}"

    @property
    def threads(self) -> int:
        return 32 * self.warps_m * self.warps_n

    @property
    def warp_tile(self) -> tuple[int, int]:
        """(rows, columns) of the output one warp accumulates."""
        return self.bm // self.warps_m, self.bn // self.warps_n

    @property
    def ring_bytes(self) -> int:
        """The cp.async ring: ``stages`` copies of A[BM][BK] and B[BN][BK], 2-byte elements."""
        return self.stages * (self.bm + self.bn) * self.bk * 2

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory: the ring, or the epilogue's staging tile BM x (BN + 8) if larger
        (fp32 elements: the tile it stages before adding Cin)."""
        return max(self.ring_bytes, self.bm * (self.bn + 8) * 4)

    @property
    def accumulators_per_thread(self) -> int:
        wm, wn = self.warp_tile
        return wm * wn // 32

    def fragment_double_buffering(self, iterator: str = "optimized") -> bool:
        """Whether the kernel runs its fragment-double-buffered main loop (``FRAG_DB``) for this
        description: the ``optimized`` iterator, and either warp tiles of at most 64 accumulators
        per thread under a register cap (65536 / (threads · min_blocks)) of at least 160, or a cap
        of at least 255 with at most 16 loader chunk rows (A and B) per thread. Mirrors the
        ``constexpr bool FRAG_DB`` of ``12_igemm_pipelined.cu``."""
        if self.bk not in (32, 64) or self.threads % (self.bk // 8):
            return False  # not a shape the kernel builds
        reg_cap = 65536 // (self.threads * max(self.min_blocks, 1))
        rows_per_pass = self.threads // (self.bk // 8)
        chunk_rows = self.bm // rows_per_pass + self.bn // rows_per_pass
        return iterator == "optimized" and (
            (self.accumulators_per_thread <= 64 and reg_cap >= 160) or (reg_cap >= 255 and chunk_rows <= 16)
        )

    def reason(self, smem_limit: int = MAX_SMEM_PER_BLOCK) -> str | None:
        """None if the kernel can be built and launched with this description, else why not.

        The rules are the kernel's static_asserts and launch limits, then whether
        ``12_igemm_pipelined.cu`` instantiates it (`TILES`)."""
        im, inn, ik = INSTRUCTION
        if tuple(self.instruction) != INSTRUCTION:
            return f"instruction shape {self.instruction}: the kernel issues mma.sync m{im}n{inn}k{ik} only"
        if self.bk not in (32, 64):
            return f"BK = {self.bk}: the swizzled stage rows hold 32 or 64 elements"
        if self.stages < 2:
            return f"stages = {self.stages}: a pipeline needs at least 2 (one loading, one computing)"
        if self.warps_m < 1 or self.warps_n < 1 or self.threads > 1024:
            return f"{self.warps_m} x {self.warps_n} warps: need 1 .. 32 warps in all"
        if self.bm % self.warps_m or self.bn % self.warps_n:
            return f"{self.bm} x {self.bn} does not split into {self.warps_m} x {self.warps_n} warps"
        wm, wn = self.warp_tile
        if wm % im or wn % (2 * inn):
            return (
                f"warp tile {wm} x {wn}: rows must be a multiple of {im} and columns of {2 * inn} "
                "(one ldmatrix.x4 loads two 8-column B fragments)"
            )
        chunks_per_row = self.bk // 8
        rows_per_pass = self.threads // chunks_per_row
        if self.threads % chunks_per_row or self.bm % rows_per_pass or self.bn % rows_per_pass:
            return (
                f"{self.threads} threads move {rows_per_pass} rows of 16-byte chunks per pass; "
                f"BM = {self.bm} and BN = {self.bn} must be multiples of it"
            )
        runs_per_row = self.bn // 8  # the epilogue's 16-byte output runs
        if self.threads % runs_per_row or self.bm % (self.threads // runs_per_row):
            return (
                f"the epilogue stores rows of {runs_per_row} 16-byte runs with {self.threads} threads: "
                f"the threads must cover whole rows and BM = {self.bm} a whole number of passes"
            )
        if self.accumulators_per_thread > 128:
            return (
                f"{self.accumulators_per_thread} fp32 accumulators per thread (warp tile {wm} x {wn}): over 128 "
                "they spill out of the 255 registers"
            )
        regs = min(255, 65536 // (self.threads * max(self.min_blocks, 1)))
        if self.min_blocks < 1 or self.accumulators_per_thread + 64 > regs:
            return (
                f"min_blocks = {self.min_blocks}: {self.min_blocks} blocks of {self.threads} threads leave "
                f"{regs} registers per thread, too few for {self.accumulators_per_thread} accumulators plus "
                "fragments and addresses (~64)"
            )
        if self.shared_bytes > smem_limit:
            return f"needs {self.shared_bytes} B of shared memory per block; the limit is {smem_limit} B"
        if self.name not in TILES:
            return f"{CU_FILE} has no entry point for {self.name}; instantiated: {', '.join(TILES)}"
        return None


def _instantiated() -> dict[str, tuple[str, ...]]:
    """{tile name: iterators} from the ``PIPE_ENTRY(...)`` lines of the ``.cu`` file (the one list)."""
    from .compile import kernel_path

    out: dict[str, list[str]] = {}
    pat = re.compile(r"^PIPE_ENTRY\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), \w+, (\w+)\)", re.M)
    for bm, bn, bk, wm, wn, st, mb, it in pat.findall(kernel_path(CU_FILE).read_text()):
        out.setdefault(f"{bm}x{bn}x{bk}_w{wm}x{wn}_s{st}_b{mb}", []).append(it)
    return {k: tuple(v) for k, v in out.items()}


INSTANTIATED = _instantiated()
TILES = tuple(INSTANTIATED)


def iterator_reason(p: Conv2dProblem, iterator: str) -> str | None:
    """None if ``iterator`` handles ``p``'s channel count (and, for ``optimized``, its filter size:
    R, S <= `MAX_MASKED_TAPS`), else why not."""
    if iterator not in ITERATORS:
        return f"iterator {iterator!r}: choose one of {', '.join(ITERATORS)}"
    if iterator == "optimized" and p.C % 8:
        return f"the optimized iterator loads 8 channels (16 bytes) at a time: needs C % 8 == 0; got C = {p.C}"
    if iterator == "optimized" and max(p.R, p.S) > MAX_MASKED_TAPS:
        return (
            f"the optimized iterator keeps one bit per filter row and column (tap masks): needs "
            f"R, S <= {MAX_MASKED_TAPS}; got R = {p.R}, S = {p.S}"
        )
    if iterator == "few_channels" and p.C > FEW_CHANNELS_MAX_C:
        return f"the few_channels iterator is for C <= {FEW_CHANNELS_MAX_C}; got C = {p.C}"
    return None


def choose_iterator(p: Conv2dProblem) -> str:
    """``optimized`` if C % 8 == 0 and R, S <= `MAX_MASKED_TAPS`, ``few_channels`` if C <= 8,
    else ``analytic``."""
    if iterator_reason(p, "optimized") is None:
        return "optimized"
    return "few_channels" if p.C <= FEW_CHANNELS_MAX_C else "analytic"


def tiles_for(iterator: str) -> tuple[TileDescription, ...]:
    """The tile descriptions instantiated with ``iterator``."""
    return tuple(TileDescription.parse(t) for t, its in INSTANTIATED.items() if iterator in its)


def blocks(p: Conv2dProblem, t: TileDescription) -> int:
    """Output tiles of ``p`` under ``t``: ceil(GEMM-M / BM) * ceil(K / BN)."""
    return _cdiv(p.gemm.m, t.bm) * _cdiv(p.K, t.bn)


# The tile rule (see `choose_tile`), fitted to sweeps of the optimized tile descriptions over the
# 38 ResNet-50 layers (N = 32 and 256, fp16) on the H200 (132 SMs). What won:
# * K <= 64: 128 x 64 x 32 (4 warps of 64 x 32; 159 registers, 3 blocks per SM): a 128-wide
#   filter tile would be half empty;
# * wherever 128 x 128 makes at least MIN_BLOCKS tiles: 128 x 128 x 64, 3 stages, with 4 warps of
#   64 x 64 and fragment double buffering (255 registers, 96 KiB of shared memory, 2 blocks per
#   SM): half the pipeline steps of BK = 32, so half the per-step copies, waits and barriers;
# * fewer tiles: 128 x 64 x 32, and below MIN_BLOCKS of those 64 x 64 x 64 (more, smaller
#   blocks with fewer pipeline steps each).
# Day 12's executed notebook (section 9) runs the sweep and compares the rule with the best tile
# per layer; the rule is fitted to these layers and this GPU (day 14 tunes per workload).
MIN_BLOCKS = 200


def choose_tile(p: Conv2dProblem, iterator: str | None = None) -> TileDescription:
    """The tile description ``igemm_pipelined`` runs for ``p`` (the rule above).

    ``optimized``: K <= 64 -> 128x64x32_w2x2_s4_b1; else 128x128x64_w2x2_s3_b1 if it makes at
    least `MIN_BLOCKS` tiles, else 128x64x32_w2x2_s4_b1 if that does, else 64x64x64_w2x2_s4_b1.
    ``analytic``/``few_channels``: 128x64x32_w2x2_s4_b1 if it makes `MIN_BLOCKS` tiles, else
    64x64x32_w2x2_s4_b1.
    """
    it = iterator or choose_iterator(p)
    mid = TileDescription.parse("128x64x32_w2x2_s4_b1")
    if it != "optimized":
        return mid if blocks(p, mid) >= MIN_BLOCKS else TileDescription.parse("64x64x32_w2x2_s4_b1")
    big = TileDescription.parse("128x128x64_w2x2_s3_b1")
    if p.K > 64 and blocks(p, big) >= MIN_BLOCKS:
        return big
    if p.K <= 64 or blocks(p, mid) >= MIN_BLOCKS:
        return mid
    return TileDescription.parse("64x64x64_w2x2_s4_b1")


def choose_swizzle(p: Conv2dProblem, tile: TileDescription) -> int:
    """log2 of the filter tiles that consecutive blocks visit: 0 (no swizzle) for one filter
    tile, else 1 for two and 2 for more (4 filter tiles per A tile, CUTLASS's common choice)."""
    n_tiles = _cdiv(p.K, tile.bn)
    return 0 if n_tiles == 1 else 1 if n_tiles == 2 else 2


@dataclass(frozen=True)
class PipelinedConfig:
    """What one launch runs: a tile description, an iterator and a swizzle (log2)."""

    tile: TileDescription
    iterator: str
    swizzle: int

    def entry(self, dtype: str) -> str:
        return f"igemm_pipelined_{self.tile.name}_{self.iterator}_{dtype}"

    def launch(self, p: Conv2dProblem) -> LaunchConfig:
        """grid (ceil(M/BM) << swizzle, ceil(ceil(K/BN) / 2^swizzle)), block (32·warps)."""
        t, lg = self.tile, self.swizzle
        m_tiles, n_tiles = _cdiv(p.gemm.m, t.bm), _cdiv(p.K, t.bn)
        return LaunchConfig(grid=(m_tiles << lg, _cdiv(n_tiles, 1 << lg), 1), block=(t.threads, 1, 1),
                            shared_bytes=t.shared_bytes)  # fmt: skip


def choose(
    p: Conv2dProblem, tile: TileDescription | str | None = None, iterator: str | None = None, swizzle: int | None = None
) -> PipelinedConfig:
    """The configuration for ``p``: each of ``tile`` (a `TileDescription` or its name),
    ``iterator`` and ``swizzle`` left None is chosen by `choose_tile`, `choose_iterator`,
    `choose_swizzle`. Nothing is validated here (see `config_reason`)."""
    it = iterator or choose_iterator(p)
    t = TileDescription.parse(tile) if isinstance(tile, str) else tile or choose_tile(p, it)
    sw = choose_swizzle(p, t) if swizzle is None else swizzle
    return PipelinedConfig(t, it, sw)


def config_reason(p: Conv2dProblem, cfg: PipelinedConfig) -> str | None:
    """None if ``cfg`` runs ``p``, else why not (tile, iterator, swizzle, 32-bit limits)."""
    if p.groups != 1:
        return f"needs groups=1; got {p.groups}"
    reason = int32_reason(p) or int32_walk_reason(p, cfg.tile.bk)
    if reason:
        return reason
    reason = cfg.tile.reason(smem_limit=2**31)  # the device's limit is checked in `Variant.supports`
    if reason:
        return f"tile {cfg.tile.name}: {reason}"
    reason = iterator_reason(p, cfg.iterator)
    if reason:
        return reason
    if cfg.iterator not in INSTANTIATED[cfg.tile.name]:
        why_not = "; ".join(
            f"{it}: {r}" for it in INSTANTIATED[cfg.tile.name] if (r := iterator_reason(p, it)) is not None
        )
        return (
            f"tile {cfg.tile.name} is not instantiated with the {cfg.iterator} iterator; "
            f"it is with: {', '.join(INSTANTIATED[cfg.tile.name])}" + (f" ({why_not})" if why_not else "")
        )
    if not 0 <= cfg.swizzle <= 4:
        return f"swizzle = {cfg.swizzle}: log2 of the filter tiles per A tile, 0 .. 4"
    return None


def int32_walk_reason(p: Conv2dProblem, bk: int) -> str | None:
    """This kernel's own 32-bit limits, beyond `helpers.igemm.int32_reason`: its GEMM-K walks step
    by BK (``CEIL_DIV(C, BK)``, ``c0 += BK``, ``t * BK``), so R·S·C + 2·BK must fit an int; and
    the input row and column it tests, origin + tap offset (p·sh − ph + r·dh), must fit one too,
    or the wrapped sum would pass the bounds test while the 64-bit address points elsewhere.
    None, or the reason."""
    if p.R * p.S * p.C + 2 * bk > INT32_MAX:
        return f"GEMM-K = R*S*C = {p.R * p.S * p.C} plus two BK = {bk} steps does not fit the kernel's 32-bit walk"
    axes = (("rows", p.P, p.stride[0], p.padding[0], p.R, p.dilation[0], p.H),
            ("columns", p.Q, p.stride[1], p.padding[1], p.S, p.dilation[1], p.W))  # fmt: skip
    for what, n_out, st, pad, taps, dil, size in axes:
        reach = (n_out - 1) * st + (taps - 1) * dil + pad + size
        if reach > INT32_MAX:
            return f"input {what}: output origin + filter reach + padding + size = {reach} does not fit 32-bit offsets"
    return None


PLAIN = Epilogue()  # alpha = 1, beta = 0, no bias, no ReLU: the plain convolution


def pipelined_args(p: Conv2dProblem, cfg: PipelinedConfig, epilogue: Epilogue = PLAIN, cin: int = 0,
                   bias: int = 0) -> tuple:  # fmt: skip
    """The scalars after x, w, y: N, C, H, W, K, R, S, P, Q, sh, sw, ph, pw, dh, dw (int32), the
    Cin and bias pointers (0 for none), alpha, beta (float32), relu, swizzle (int32)."""
    ints = (p.N, p.C, p.H, p.W, p.K, p.R, p.S, p.P, p.Q, *p.stride, *p.padding, *p.dilation)
    return (*(np.int32(v) for v in ints), np.uintp(cin), np.uintp(bias), np.float32(epilogue.alpha),
            np.float32(epilogue.beta), np.int32(epilogue.relu), np.int32(cfg.swizzle))  # fmt: skip


def covers(p: Conv2dProblem, launch: LaunchConfig, cfg: PipelinedConfig) -> np.ndarray:
    """Writes per element of Y[m][k] (NHWC, flat) of the launch: block (bx, by) computes output tile
    (bx >> s, (by << s) + (bx & (2^s - 1))) and writes its rows < M, columns < K once; blocks past
    the last filter tile write nothing."""
    t, lg = cfg.tile, cfg.swizzle
    bx = np.arange(launch.grid[0])[:, None]
    by = np.arange(launch.grid[1])[None, :]
    tm = np.broadcast_to(bx >> lg, (launch.grid[0], launch.grid[1])).ravel()
    tn = ((by << lg) + (bx & ((1 << lg) - 1))).ravel()
    keep = tn * t.bn < p.K
    counts = np.zeros((_cdiv(p.gemm.m, t.bm), _cdiv(p.K, t.bn)), dtype=np.int64)
    np.add.at(counts, (tm[keep], tn[keep]), 1)
    return counts[(np.arange(p.gemm.m) // t.bm)[:, None], (np.arange(p.K) // t.bn)[None, :]].ravel()


def tensor_check(p: Conv2dProblem, x: torch.Tensor, w: torch.Tensor, y: torch.Tensor | None, cfg: PipelinedConfig
                 ) -> str | None:  # fmt: skip
    """sm_80+; x and w 16-byte aligned for the optimized iterator (cp.async of 16 bytes); y
    16-byte aligned when K % 8 == 0 (16-byte stores). None or the reason."""
    if x.is_cuda:
        cc = torch.cuda.get_device_capability(x.device)
        if cc < MIN_CC:
            need_cc = f"{MIN_CC[0]}.{MIN_CC[1]}"
            return f"needs a GPU of compute capability {need_cc}+ (cp.async, ldmatrix); this one is {cc[0]}.{cc[1]}"
    need = [("x", x), ("w", w)] if cfg.iterator == "optimized" else []
    if y is not None and p.K % 8 == 0:
        need.append(("y", y))
    for nm, t in need:
        if t.data_ptr() % VEC_ALIGN:
            return f"{nm}.data_ptr() is not {VEC_ALIGN}-byte aligned (a view with a storage offset?): pass {nm}.clone()"
    return None


def make_pipelined(
    name: str = "igemm_pipelined",
    tile: TileDescription | str | None = None,
    iterator: str | None = None,
    swizzle: int | None = None,
) -> Variant:
    """A day-12 variant (not registered) with any of tile, iterator, swizzle forced; None = `choose`.

    Raises:
        ValueError: a forced tile that is invalid or not instantiated (the reason says which), an
            unknown iterator, a forced (tile, iterator) pair the ``.cu`` file does not instantiate,
            or a swizzle outside 0..4. Problems the forced choice cannot run are refused per problem
            by `Variant.supports`, with the reason.
    """
    if tile is not None:
        t = TileDescription.parse(tile) if isinstance(tile, str) else tile
        reason = t.reason()
        if reason:
            raise ValueError(f"tile {t.name}: {reason}")
        tile = t
    if iterator is not None and iterator not in ITERATORS:
        raise ValueError(f"iterator {iterator!r}: choose one of {', '.join(ITERATORS)}")
    if tile is not None and iterator is not None and iterator not in INSTANTIATED[tile.name]:
        raise ValueError(
            f"tile {tile.name} is not instantiated with the {iterator} iterator; "
            f"it is with: {', '.join(INSTANTIATED[tile.name])}"
        )
    if swizzle is not None and not 0 <= swizzle <= 4:
        raise ValueError(f"swizzle = {swizzle}: log2 of the filter tiles per A tile, 0 .. 4")
    pick: Callable[[Conv2dProblem], PipelinedConfig] = partial(choose, tile=tile, iterator=iterator, swizzle=swizzle)
    forced = ", ".join(f"{k}={v.name if k == 'tile' else v}" for k, v in
                       (("tile", tile), ("iterator", iterator), ("swizzle", swizzle)) if v is not None)  # fmt: skip
    return Variant(
        name=name,
        day=12,
        cu_file=CU_FILE,
        entry="igemm_pipelined_128x128x32_w2x2_s4_b1_optimized_fp16",
        entry_fn=lambda p: pick(p).entry(p.dtype),
        summary="tensor cores: cp.async multistage pipeline, tile descriptions, iterators, swizzle, fused epilogue"
        + (f" ({forced})" if forced else ""),
        supports_fn=lambda p: config_reason(p, pick(p)),
        launch_fn=lambda p: pick(p).launch(p),
        args_fn=lambda p: pipelined_args(p, pick(p)),
        covers_fn=lambda p, launch: covers(p, launch, pick(p)),
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        tensor_check_fn=lambda p, x, w, y: tensor_check(p, x, w, y, pick(p)),
    )


register(make_pipelined())


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()


def _overlap(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two dense tensors share any byte of memory."""
    (a0, a1), (b0, b1) = _byte_range(a), _byte_range(b)
    return a0 < b1 and b0 < a1 and a.device == b.device


def _check_aliasing(x, w, y, cin, bias) -> None:
    """y is written while other blocks still read x, w, Cin and bias: y may share memory with none
    of them, except Cin being exactly y (each element is read by the thread that writes it)."""
    for nm, t in (("x", x), ("w", w), ("bias", bias)):
        if t is not None and _overlap(y, t):
            raise ValueError(f"y overlaps {nm} in memory: the kernel writes y while other blocks read {nm}")
    if cin is not None and _overlap(y, cin) and _byte_range(cin) != _byte_range(y):
        raise ValueError("cin overlaps y without being y: pass y itself (in place) or a separate tensor")


def _check_scalars(ep: Epilogue) -> None:
    """alpha and beta go to the kernel as float32: they must be finite there, and a nonzero beta
    must not round to 0 (the kernel would skip Cin while the caller expects it read)."""
    for nm, v in (("alpha", ep.alpha), ("beta", ep.beta)):
        with np.errstate(over="ignore"):  # an overflow is what this checks
            f = float(np.float32(v))
        if not np.isfinite(f) or (v != 0 and f == 0):
            raise ValueError(f"epilogue {nm} = {v!r} is {f} in float32: pass a finite value the kernel can represent")


def _check_operand(nm: str, t, shape: tuple, ref: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{nm} must be a torch.Tensor or None; got {type(t).__name__}")
    if t.dtype != ref.dtype or tuple(t.shape) != shape or not t.is_contiguous() or t.device != ref.device:
        raise ValueError(
            f"{nm} must be a contiguous {ref.dtype} tensor of shape {shape} on {ref.device}; "
            f"got {t.dtype} {tuple(t.shape)} on {t.device}{'' if t.is_contiguous() else ', not contiguous'}"
        )


def prepare_fused(
    problem: Conv2dProblem,
    x: torch.Tensor,
    w: torch.Tensor,
    cin: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    epilogue: Epilogue = PLAIN,
    y: torch.Tensor | None = None,
    variant: Variant | str = "igemm_pipelined",
) -> tuple[Callable[[], None], torch.Tensor]:
    """Validate, compile and return ``(launch, y)`` for D = act(alpha·conv(x, w) + beta·cin + bias).

    Shapes and layouts: x NHWC ``problem.x_shape``, w KRSC, y and ``cin`` NHWC ``problem.y_shape``
    (``cin`` may be ``y`` itself: an in-place residual add), ``bias`` (K,); all of the problem's
    dtype (fp16 or bf16), contiguous, on x's GPU. The epilogue runs in fp32 on the fp32
    accumulators and rounds once. ``cin`` is read only when ``epilogue.beta != 0``.

    Raises:
        everything `helpers.variants.prepare` raises, before any launch; TypeError/ValueError
        for a ``cin`` or ``bias`` of the wrong type, dtype, shape, layout or device; ValueError
        for a ``cin`` not 16-byte aligned when it is read (beta != 0) and K % 8 == 0, if
        ``epilogue.beta != 0`` without ``cin``, for alpha or beta that float32 cannot carry
        (not finite, or a nonzero beta that rounds to 0), and for a y that shares memory with x,
        w, bias or (other than being it) cin.
    """
    from . import variants as hv
    from .compile import load_kernel

    v = hv.get(variant)
    if v.cu_file != CU_FILE:
        raise ValueError(f"prepare_fused runs day 12's kernel; {v.name} is {v.cu_file}")
    _validate(v, problem, x, w, y)
    if cin is not None:
        _check_operand("cin", cin, problem.y_shape, x)
        if epilogue.beta != 0 and problem.K % 8 == 0 and cin.data_ptr() % VEC_ALIGN:
            raise ValueError(f"cin.data_ptr() is not {VEC_ALIGN}-byte aligned (read 16 bytes at a time when "
                             "K % 8 == 0; a view with a storage offset?): pass cin.clone()")  # fmt: skip
    if bias is not None:
        _check_operand("bias", bias, (problem.K,), x)
    if epilogue.beta != 0 and cin is None:
        raise ValueError(f"epilogue beta = {epilogue.beta} needs cin (the tensor it scales)")
    _check_scalars(epilogue)
    if y is None:
        y = torch.empty(problem.y_shape, dtype=problem.torch_dtype, device=x.device)
    _check_aliasing(x, w, y, cin, bias)
    cfg = v.launch(problem)
    k = load_kernel(v.cu_file, v.entry_for(problem), v.defines, dynamic_smem=cfg.shared_bytes)
    if cfg.threads_per_block > k.max_threads_per_block:
        raise UnsupportedProblem(f"{v.name}: block of {cfg.threads_per_block} threads, this build allows "
                                 f"{k.max_threads_per_block}")  # fmt: skip
    base = v.args_fn(problem)  # `pipelined_args` with the plain epilogue: keep the sizes and the swizzle
    cin_p, bias_p = (t.data_ptr() if t is not None else 0 for t in (cin, bias))
    scalars = (*base[:15], np.uintp(cin_p), np.uintp(bias_p), np.float32(epilogue.alpha), np.float32(epilogue.beta),
               np.int32(epilogue.relu), base[20])  # fmt: skip
    args = (np.uintp(x.data_ptr()), np.uintp(w.data_ptr()), np.uintp(y.data_ptr()), *scalars)
    fn = k.function

    def launch() -> None:
        fn(*args, grid=cfg.grid, block=cfg.block, shared=cfg.shared_bytes)

    return launch, y
