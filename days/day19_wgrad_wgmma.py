"""Day 19's variant: wgrad on Hopper's wgmma/TMA main loop (``kernels/conv2d/19_wgrad_wgmma.cu``),
with a deterministic split-K.

dw[k, r, s, c] = Σ_{n, p, q} dy[n, p, q, k] · x[n, p·sh − ph + r·dh, q·sw − pw + s·dw, c] is, per
filter tap (r, s), a GEMM with GEMM-M = K (filters), GEMM-N = C (channels) and GEMM-K = N·P·Q
(output pixels), walked 64 pixels a stage. Both operands arrive by the copy engine with pixels as
shared-memory rows:

* A = dy through a tiled map of dy as the matrix [N·P·Q][K] (`dy_map`: boxes of 64 filters x 64
  pixels), zeros past K and past N·P·Q;
* B = x through day 16's im2col map (`x_map`: boxes of 64 channels x 64 pixels of one tap, the
  tap's offset given per copy), zeros outside the image, past C, and for the pixels past N·P·Q
  (they fall in images n >= N, outside the map: the copy engine never reads outside a tensor and
  fills what is outside with zeros; A's zeros there would also do for a finite x).

A row of 128 bytes is one GEMM-K index holding 64 consecutive M (or N) elements: both operands
are MN-major ("transposed") for wgmma, which takes that for f16/bf16 with imm-trans-a =
imm-trans-b = 1 and a descriptor of the MN-major SW128 layout (19_wgrad_wgmma.cu's ``sw128_mn_desc``:
SBO = 1024, the next 8 pixel rows; LBO = 8192, the next 64-wide box of channels; a k16 slice
2048 bytes further). `sw128_mn_desc`, `decode_desc`, `tma_box_write` and `wgmma_read` simulate
that on the CPU: the copy engine's 128-byte swizzle on the way in, the descriptor's canonical
layout on the way out (`slot_descriptors` lists the descriptors the kernel's ``mma_step`` builds).

Work is split into units (split z, tap, m-tile, n-tile); split z takes the GEMM-K steps
[steps·z / splits, steps·(z + 1) / splits) (`split_ranges`, day 14's `split_k_slices` in steps of
64 pixels). `choose_splits` picks the split factor with the least `split_cost`: the busiest
block's steps (whole rounds of units over the SMs) plus the fp32 partials' extra traffic; the SM
count is an argument (the GPU's, 132 without one). Persistent blocks (at most one per SM) take
units b, b + grid, ... (`block_units`).

The launches (`wgrad_wgmma_launches`):

* ``main``: the wgmma kernel; with one split it writes dw (fp16/bf16) itself; with more (or the
  fp32-dw option) each split's fp32 partial goes to the workspace [splits][K][R][S][C];
* ``reduce`` (splits > 1 or fp32 dw): ``wgrad_wgmma_reduce_<dtype>`` sums the splits in the order
  0, 1, ..., splits − 1 in fp32 (the same bits every run, whatever order the blocks ran in) and
  rounds once into dw; with the fp32-dw option (`make_wgrad_wgmma` ``dw32=True``) it also writes
  the fp32 sum into the workspace past the partials (`dw32_offset`, `dw32_view`).

CPU models of what each launch writes: `main_writes` and `reduce_writes` (every element of dw or
of the workspace's partials exactly once), `main_model` (the unit loop, each step's boxes placed
through the swizzle and read back through the descriptors) and `reduce_model` (the fp32 sum in
split order). Refused with the reason (`wgrad_wgmma_reason`): groups, C % 8 or K % 8 (the maps'
16-byte strides), the im2col map's limits as day 16 (corners, filter offsets, strides), 32-bit
sizes; and by the harness, shared memory beyond the GPU's.

Sources: the PTX ISA (NVIDIA), "Asynchronous Warpgroup Level Matrix Multiply-Accumulate": the
shared-memory matrix layout (K-major and MN-major, imm-trans-a/b, f16/bf16 only for MN-major) and
the matrix descriptor (start address, leading and stride dimension byte offsets, swizzle mode);
"Tensors": the tiled and im2col modes, the 128-byte swizzle, out-of-bound fill. NVIDIA CUTLASS,
``include/cute/atom/mma_traits_sm90_gmma.hpp`` (``make_gmma_desc<Major::MN>``: the canonical
MN-major SW128 layout Swizzle<3,4,3> o ((8, n), (8, k)) : ((1, LBO), (8, SBO)) in 16-byte units)
and ``include/cute/arch/mma_sm90_desc.hpp`` (``GmmaDescriptor``'s bit fields); CUTLASS's
``docs/efficient_gemm.md`` (split-K, parallel reduction).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace

import numpy as np
import torch

from helpers import gpu
from helpers.compile import kernel_path
from helpers.epilogue import Epilogue
from helpers.problem import Conv2dProblem
from helpers.tma import ELEMENT_BYTES, OFFSET_LIMIT, Im2colMap, TensorMap, TiledMap, im2col_rows
from helpers.tune import Candidate, GemmTile, Machine, Space, gemm_tile_us, register_space
from helpers.variants import INT32_MAX, Buffer, KernelLaunch, LaunchConfig, Variant, register

from .day14_backward.space import between_splits
from .day14_backward.space import config_name as space_config  # ``<tile>_k<splits>``: the grid is the GPU's
from .day14_backward.train import Kernels
from .day16_igemm_wgmma import DEFAULT_SMS, HOPPER_CC
from .kit import VEC_BYTES, alignment_reason, cdiv, grid_stride_items, groups_one_reason

CU_FILE = "19_wgrad_wgmma.cu"
BK = 64  # GEMM-K (pixels) per stage: the rows of every box
BOX = 64  # filters or channels per box: one 128-byte swizzled row of halves
ROW_BYTES = 128
BOX_BYTES = BK * ROW_BYTES  # 8 KB: one box of 64 pixels x 64 filters or channels
SBO_BYTES = 8 * ROW_BYTES  # the next 8 K-rows (pixels): one 1024-byte swizzle atom
LBO_BYTES = BOX_BYTES  # the next 64 MN elements (filters of A, channels of B): the next box
K16_BYTES = 16 * ROW_BYTES  # a k16 slice: 16 pixel rows
SWIZZLE_128B = 1  # the descriptor's layout type for the 128-byte swizzle (bits 62-63)
MIN_SPLIT_STEPS = 8  # no split under 8 steps of 64 pixels (512 pixels): the ring needs steps to fill
FLOP_PER_BYTE = 295.0  # the split rule's GPU balance: an H100 SXM's dense fp16 tensor rate over its DRAM
# bandwidth (989 TFLOP/s / 3.35 TB/s, NVIDIA's H100 datasheet); a machine's own ratio can be passed instead
REDUCE_THREADS = 256
REDUCE_BLOCKS_PER_SM = 8  # the reduction's grid-stride loop: at most 8 blocks of 256 threads per SM
NULL = np.uintp(0)  # a pointer argument the kernel does not read


# ---- the entries -------------------------------------------------------------------------------


@dataclass(frozen=True)
class WgradWgmmaTile:
    """A ``WGRAD_WGMMA_ENTRY`` of the ``.cu`` file: ``bm`` filters x ``bn`` channels of one tap per
    block, ``mt`` 64-filter m-tiles per consumer warpgroup, ``consumers`` of them, ``stages`` ring slots."""

    bm: int
    bn: int
    mt: int
    consumers: int
    stages: int

    @property
    def name(self) -> str:
        return f"{self.bm}x{self.bn}_c{self.consumers}_s{self.stages}"

    def entry(self, dtype: str) -> str:
        return f"wgrad_wgmma_{self.name}_{dtype}"

    @property
    def threads(self) -> int:
        """128 per warpgroup: the producer and the consumers."""
        return 128 * (1 + self.consumers)

    @property
    def slot_bytes(self) -> int:
        """One ring slot: bm / 64 boxes of dy, then bn / 64 boxes of x (8 KB each)."""
        return (self.bm + self.bn) * ROW_BYTES

    @property
    def shared_bytes(self) -> int:
        """The ring, ``stages`` slots, and 1024 bytes to align it to 1024 (the swizzle's period)."""
        return self.stages * self.slot_bytes + 1024


def read_entries() -> tuple[WgradWgmmaTile, ...]:
    """The tiles the ``.cu`` file instantiates, from its ``WGRAD_WGMMA_ENTRY`` lines."""
    rows = re.findall(r"^WGRAD_WGMMA_ENTRY\((\d+), (\d+), (\d+), (\d+), (\d+)\)", kernel_path(CU_FILE).read_text(),
                      re.M)
    return tuple(WgradWgmmaTile(*map(int, r)) for r in rows)


ENTRIES = read_entries()
BY_NAME = {t.name: t for t in ENTRIES}
REG_TARGETS = re.compile(r"^constexpr int PRODUCER_REGS = (\d+), CONSUMER_REGS = (\d+);", re.M)


def moved_registers(tile: WgradWgmmaTile) -> int:
    """Registers the block holds after setmaxnreg (two consumers: the producer's .dec to
    PRODUCER_REGS, the consumers' .inc to CONSUMER_REGS; one consumer moves none: 0). Must stay
    within ptxas's registers x threads, or .inc waits forever.

    Raises:
        ValueError: the constants are not in the file.
    """
    if tile.consumers == 1:
        return 0
    m = REG_TARGETS.search(kernel_path(CU_FILE).read_text())
    if not m:
        raise ValueError(f"{CU_FILE}: the setmaxnreg constants (PRODUCER_REGS, CONSUMER_REGS) moved")
    return 128 * int(m.group(1)) + 128 * tile.consumers * int(m.group(2))


@dataclass(frozen=True)
class WgradWgmmaConfig:
    """One run: the tile, the split factor, the grid (persistent blocks) and the fp32-dw option."""

    tile: WgradWgmmaTile
    splits: int
    blocks: int
    dw32: bool = False

    @property
    def name(self) -> str:
        return f"{self.tile.name}_k{self.splits}_g{self.blocks}" + ("_dw32" if self.dw32 else "")


# ---- the shared-memory simulation: the copy engine's swizzle, the descriptor's reads -----------


def swizzle128(addr: np.ndarray | int) -> np.ndarray | int:
    """The 128-byte swizzle on a shared-memory byte address: the 16-byte chunk bits (4-6) XOR the
    128-byte row bits (7-9), i.e. chunk j of row r lands at chunk j ^ (r mod 8) within each 1024-byte
    atom (CUTLASS's Swizzle<3,4,3> on the byte address; the copy engine's CU_TENSOR_MAP_SWIZZLE_128B
    and wgmma's layout type 1 apply the same function)."""
    return addr ^ (((addr >> 7) & 7) << 4)


def sw128_mn_desc(addr: int, lbo: int, sbo: int = SBO_BYTES) -> int:
    """19_wgrad_wgmma.cu's ``sw128_mn_desc`` on the CPU (with ``sbo`` open, to plant faults): start >> 4
    in bits 0-13, LBO >> 4 in 16-29, SBO >> 4 in 32-45, base offset 0 (49-51), layout 1 = 128-byte
    swizzle in 62-63."""
    return ((addr & 0x3FFFF) >> 4) | (((lbo & 0x3FFFF) >> 4) << 16) | ((sbo >> 4) << 32) | (SWIZZLE_128B << 62)


def decode_desc(desc: int) -> dict[str, int]:
    """A wgmma shared-memory descriptor's fields (PTX ISA, "Matrix Descriptor"; CUTLASS's
    ``GmmaDescriptor``): start, lbo, sbo in bytes, base_offset, layout (1: 128-byte swizzle)."""
    return {"start": (desc & 0x3FFF) << 4, "lbo": ((desc >> 16) & 0x3FFF) << 4, "sbo": ((desc >> 32) & 0x3FFF) << 4,
            "base_offset": (desc >> 49) & 7, "layout": (desc >> 62) & 3}


def tma_box_write(smem: np.ndarray, dst: int, box: np.ndarray) -> None:
    """A copy's box (``rows`` x 64 two-byte elements, its innermost dimension last) written at
    shared byte address ``dst`` (1024-aligned) with the 128-byte swizzle, as the copy engine writes
    it: element e of row i at swizzle128(dst + 128 i + 2 e). ``smem`` is a uint16 array of the
    shared memory, indexed by byte address / 2."""
    rows, width = box.shape
    if width != BOX or dst % 1024:
        raise ValueError(f"a box of 64-element rows at a 1024-aligned address; got {box.shape} at {dst}")
    addr = dst + ROW_BYTES * np.arange(rows)[:, None] + 2 * np.arange(width)[None, :]
    smem[swizzle128(addr) // 2] = box


def wgmma_read(smem: np.ndarray, desc: int, mn: int, k: int = 16) -> np.ndarray:
    """The ``mn`` x ``k`` matrix (MN index first) wgmma reads through ``desc`` from an MN-major
    operand with the 128-byte swizzle (imm-trans = 1, f16/bf16): element (i, j), i = 64 c + e,
    j = 8 g + l, from byte start + c LBO + g SBO + 128 l + 2 e, swizzled (the canonical layout
    Swizzle<3,4,3> o ((8, n), (8, k)) : ((1, LBO), (8, SBO)) in 16-byte units).

    Raises:
        ValueError: a descriptor that is not the 128-byte swizzle with base offset 0, or mn not a
            multiple of 64.
    """
    f = decode_desc(desc)
    if f["layout"] != SWIZZLE_128B or f["base_offset"] != 0:
        raise ValueError(f"wgmma_read models the 128-byte swizzle with base offset 0; got {f}")
    if mn % BOX:
        raise ValueError(f"MN = {mn}: whole 64-element rows of 128 bytes")
    i, j = np.arange(mn)[:, None], np.arange(k)[None, :]
    addr = f["start"] + (i // BOX) * f["lbo"] + (j // 8) * f["sbo"] + (j % 8) * ROW_BYTES + 2 * (i % BOX)
    return smem[swizzle128(addr) // 2]


def slot_descriptors(tile: WgradWgmmaTile, slot: int, group: int) -> list[tuple[int, int, int, int]]:
    """The descriptors ``mma_step`` builds for consumer ``group`` on the slot at byte ``slot``:
    (kk, j, da, db) for k16 slice kk and m-tile j, in issue order. da: box MT·group + j of the slot,
    + 2048 kk; db: the first of B's boxes (after bm rows of A), LBO one box, + 2048 kk."""
    da = sw128_mn_desc(slot + group * tile.mt * BOX_BYTES, LBO_BYTES)
    db = sw128_mn_desc(slot + tile.bm * ROW_BYTES, LBO_BYTES)
    return [(kk, j, da + ((j * BOX_BYTES + kk * K16_BYTES) >> 4), db + ((kk * K16_BYTES) >> 4))
            for kk in range(BK // 16) for j in range(tile.mt)]


def place_slot(smem: np.ndarray, tile: WgradWgmmaTile, slot: int, a: np.ndarray, b: np.ndarray) -> None:
    """One stage as the producer's copies place it: ``a`` (64 pixels x bm filters of dy) as bm / 64
    boxes from ``slot``, ``b`` (64 pixels x bn channels of x) as bn / 64 boxes after them."""
    for i in range(tile.bm // BOX):
        tma_box_write(smem, slot + i * BOX_BYTES, a[:, BOX * i:BOX * (i + 1)])
    for j in range(tile.bn // BOX):
        tma_box_write(smem, slot + tile.bm * ROW_BYTES + j * BOX_BYTES, b[:, BOX * j:BOX * (j + 1)])


def bits_to_float(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Raw 16-bit fp16 or bf16 values as float64 (bf16: the high half of a float32)."""
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)


def slot_product(smem: np.ndarray, tile: WgradWgmmaTile, slot: int, group: int, dtype: str = "fp16") -> np.ndarray:
    """Consumer ``group``'s contribution of one slot, in float64, as its wgmma compute it from
    shared memory: Σ over (kk, j) of A (64 x 16, read through da) times B (16 x bn, through db),
    into rows 64 j of its MT x 64 filters. ``smem`` holds the raw bits of ``dtype`` values."""
    out = np.zeros((tile.mt * BOX, tile.bn))
    for _, j, da, db in slot_descriptors(tile, slot, group):
        a = bits_to_float(wgmma_read(smem, da, BOX), dtype)  # 64 filters x 16 pixels
        b = bits_to_float(wgmma_read(smem, db, tile.bn), dtype).T  # 16 pixels x bn channels
        out[BOX * j:BOX * (j + 1)] += a @ b
    return out


# ---- work: units, splits, blocks ---------------------------------------------------------------


def steps_of(p: Conv2dProblem) -> int:
    """GEMM-K steps: ceil(N·P·Q / 64)."""
    return cdiv(p.N * p.P * p.Q, BK)


def split_ranges(steps: int, splits: int) -> list[tuple[int, int]]:
    """The GEMM-K steps [t0, t1) of each split, as the kernel's ``unit_of`` computes them:
    t0 = steps·z // splits (day 14's `split_k_slices` in whole steps). Every split gets at least
    one step when splits <= steps.

    Raises:
        ValueError: splits outside 1 .. steps.
    """
    if not 1 <= splits <= steps:
        raise ValueError(f"splits = {splits}: 1 .. the {steps} GEMM-K steps (no empty split)")
    return [(steps * z // splits, steps * (z + 1) // splits) for z in range(splits)]


def tile_count(p: Conv2dProblem, tile: WgradWgmmaTile) -> int:
    """Output tiles of one split: ceil(K / bm)·ceil(C / bn)·R·S."""
    return cdiv(p.K, tile.bm) * cdiv(p.C, tile.bn) * p.R * p.S


def unit_of(p: Conv2dProblem, tile: WgradWgmmaTile, splits: int, u: int) -> tuple[int, int, int, int, int, int]:
    """The kernel's ``unit_of``: unit ``u`` -> (tm, tn, tap, split, t0, t1): n-tile fastest, then
    the m-tile, the tap, the split."""
    tiles_m, tiles_n = cdiv(p.K, tile.bm), cdiv(p.C, tile.bn)
    tiles = tiles_m * tiles_n
    split, rest = divmod(u, tiles * p.R * p.S)
    tap, rest = divmod(rest, tiles)
    tm, tn = divmod(rest, tiles_n)
    t0, t1 = split_ranges(steps_of(p), splits)[split]
    return tm, tn, tap, split, t0, t1


def split_cost(p: Conv2dProblem, tile: WgradWgmmaTile, splits: int, sms: int = DEFAULT_SMS,
               balance: float = FLOP_PER_BYTE) -> float:
    """The model `choose_splits` minimises, in FLOP-equivalents of one SM's tensor cores: the
    critical path, ceil(units / sms) units on the busiest block times ceil(steps / splits) steps
    of 2·BM·BN·64 FLOP each, plus the split's extra traffic spread over the whole GPU: with more
    than one split every split writes an fp32 copy of dw that the reduction reads back (8 bytes an
    element; one split writes dw directly),
    ``balance`` FLOP per byte for the GPU (the peak tensor rate over DRAM bandwidth), divided by
    ``sms`` to one SM's share. A model of two terms, not a fit: the step time and the bandwidth
    are the GPU's ratio, not measured here."""
    steps, units = steps_of(p), tile_count(p, tile) * splits
    main = cdiv(units, sms) * cdiv(steps, splits) * 2 * tile.bm * tile.bn * BK
    extra = 8 * dw_elements(p) * splits * balance / sms if splits > 1 else 0.0
    return main + extra


def choose_splits(p: Conv2dProblem, tile: WgradWgmmaTile, sms: int = DEFAULT_SMS,
                  balance: float = FLOP_PER_BYTE) -> int:
    """The split factor with the least `split_cost` (the fewest splits among equals), from 1 to
    steps // `MIN_SPLIT_STEPS` (no split under 8 steps of 64 pixels), at least 1. The cost counts
    whole waves: 15 splits of 9 tiles on 132 SMs make 135 units, two rounds for three blocks, so
    14 (one round) beats 15.

    Raises:
        ValueError: sms < 1.
    """
    if sms < 1:
        raise ValueError(f"sms = {sms}: at least one SM")
    top = max(1, steps_of(p) // MIN_SPLIT_STEPS)
    return min(range(1, top + 1), key=lambda s: (split_cost(p, tile, s, sms, balance), s))


def choose_tile(p: Conv2dProblem) -> WgradWgmmaTile:
    """The tile by the output's shape: K <= 64: 64 filters (a taller tile would be half empty) x
    64, 128 or 256 channels (C <= 64, <= 128, more); else 128 x 256 when C > 128, 256 x 128 when
    K >= 256 and C <= 128, else 128 x 128. Not fitted on a GPU yet (the largest tile that the layer
    fills; the split factor makes up the SMs)."""
    if p.K <= 64:
        return BY_NAME["64x64_c1_s8" if p.C <= 64 else "64x128_c1_s6" if p.C <= 128 else "64x256_c1_s4"]
    if p.C > 128:
        return BY_NAME["128x256_c2_s4"]
    return BY_NAME["256x128_c2_s4" if p.K >= 256 else "128x128_c2_s6"]


def device_sms() -> int:
    """The GPU's multiprocessors (torch's properties of `helpers.gpu.context_device`), or
    `DEFAULT_SMS` (132) without a GPU."""
    if not gpu.has_gpu():
        return DEFAULT_SMS
    return torch.cuda.get_device_properties(gpu.context_device().index).multi_processor_count


def choose(p: Conv2dProblem, tile: WgradWgmmaTile | str | None = None, splits: int | None = None,
           sms: int | None = None, dw32: bool = False) -> WgradWgmmaConfig:
    """The configuration for ``p``: ``tile`` (a tile or its name; `choose_tile`), ``splits``
    (`choose_splits`; a forced value is capped at the GEMM-K steps), the grid min(units, sms)
    (``sms``: the GPU's, `device_sms`, when None) and the fp32-dw option.

    Raises:
        KeyError: a tile name the ``.cu`` file does not instantiate.
    """
    t = BY_NAME[tile] if isinstance(tile, str) else tile or choose_tile(p)
    sms = device_sms() if sms is None else sms
    sp = choose_splits(p, t, sms) if splits is None else max(1, min(splits, steps_of(p)))
    return WgradWgmmaConfig(t, sp, min(tile_count(p, t) * sp, sms), dw32)


def block_units(units: int, blocks: int) -> list[list[int]]:
    """The units each persistent block takes: block b units b, b + blocks, ... (the kernel's loop)."""
    return [list(range(b, units, blocks)) for b in range(blocks)]


# ---- maps, workspace, launches -----------------------------------------------------------------


def dy_map(p: Conv2dProblem) -> TiledMap:
    """dy as the matrix [N·P·Q][K] (dims K, N·P·Q): boxes of 64 filters x 64 pixels, the 128-byte
    swizzle; zeros past K and past the last pixel."""
    e = ELEMENT_BYTES[p.dtype]
    return TiledMap(dtype=p.dtype, dims=(p.K, p.N * p.P * p.Q), strides=(p.K * e,), box=(BOX, BK))


def x_map(p: Conv2dProblem) -> Im2colMap:
    """Day 16's im2col map of x (dims C, W, H, N; the bounding box that holds P x Q pixels per
    image, walked with the strides) with 64 channels x 64 pixels per copy."""
    (sh, sw), (ph, pw) = p.stride, p.padding
    e = ELEMENT_BYTES[p.dtype]
    return Im2colMap(dtype=p.dtype, dims=(p.C, p.W, p.H, p.N),
                     strides=(p.C * e, p.W * p.C * e, p.H * p.W * p.C * e), lower=(-pw, -ph),
                     upper=((p.Q - 1) * sw - pw - (p.W - 1), (p.P - 1) * sh - ph - (p.H - 1)),
                     channels=BOX, pixels=BK, element_strides=(1, sw, sh, 1))


def dw_elements(p: Conv2dProblem) -> int:
    return p.K * p.R * p.S * p.C


def uses_workspace(cfg: WgradWgmmaConfig) -> bool:
    """Partials in the workspace (and a reduce launch): more than one split, or the fp32-dw option."""
    return cfg.splits > 1 or cfg.dw32


def dw32_offset(p: Conv2dProblem, cfg: WgradWgmmaConfig) -> int:
    """Byte offset of the fp32 dw (the fp32-dw option) in the workspace: past the partials."""
    return 4 * cfg.splits * dw_elements(p)


def workspace_bytes(p: Conv2dProblem, cfg: WgradWgmmaConfig) -> int:
    """splits fp32 copies of dw ([splits][K][R][S][C]) when `uses_workspace`, plus one more for the
    fp32 dw with ``dw32``; none for one split without it."""
    if not uses_workspace(cfg):
        return 0
    return dw32_offset(p, cfg) + (4 * dw_elements(p) if cfg.dw32 else 0)


def dw32_view(p: Conv2dProblem, cfg: WgradWgmmaConfig, workspace: torch.Tensor) -> torch.Tensor:
    """The fp32 dw [K][R][S][C] in a run's workspace (the fp32-dw option), a view.

    Raises:
        ValueError: ``cfg`` without the option.
    """
    if not cfg.dw32:
        raise ValueError(f"{cfg.name}: no fp32 dw without dw32=True")
    start = dw32_offset(p, cfg)
    return workspace[start:start + 4 * dw_elements(p)].view(torch.float32).view(p.K, p.R, p.S, p.C)


def reduce_grid(p: Conv2dProblem, sms: int = DEFAULT_SMS) -> int:
    """The reduction's blocks: one per 256 groups of 4 elements, at most `REDUCE_BLOCKS_PER_SM` per SM."""
    return max(1, min(cdiv(dw_elements(p) // 4, REDUCE_THREADS), REDUCE_BLOCKS_PER_SM * sms))


def main_args(p: Conv2dProblem, cfg: WgradWgmmaConfig) -> tuple:
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    t = cfg.tile
    tiles_m, tiles_n = cdiv(p.K, t.bm), cdiv(p.C, t.bn)
    units = tiles_m * tiles_n * p.R * p.S * cfg.splits
    direct = 0 if uses_workspace(cfg) else 1
    ints = (p.K, p.C, p.P, p.Q, sh, sw, ph, pw, dh, dw, p.S, p.R * p.S, steps_of(p), tiles_m, tiles_n, cfg.splits,
            units, direct)
    ws = Buffer("workspace") if uses_workspace(cfg) else NULL
    return (TensorMap("dy", dy_map(p)), TensorMap("x", x_map(p)), Buffer("dw"), ws, *(np.int32(v) for v in ints))


def wgrad_wgmma_launches(p: Conv2dProblem, epilogue: Epilogue, cfg: WgradWgmmaConfig) -> list[KernelLaunch]:
    """``main`` (the tile's entry, grid cfg.blocks, its threads and shared bytes; the maps of dy and
    x, dw, the workspace or null, then K, C, P, Q, sh, sw, ph, pw, dh, dw, S, taps, steps, tiles_m,
    tiles_n, splits, units, direct as int32), then with `uses_workspace` ``reduce`` (the workspace,
    dw, the fp32 dw or null, K R S C as int64, splits).

    Raises:
        ValueError: a fused epilogue (wgrad fuses none).
    """
    if not epilogue.is_plain:
        raise ValueError(f"wgrad_wgmma fuses no epilogue: it computes the plain dw; got {epilogue}")
    t = cfg.tile
    main = KernelLaunch("main", t.entry(p.dtype),
                        LaunchConfig(grid=(cfg.blocks, 1, 1), block=(t.threads, 1, 1), shared_bytes=t.shared_bytes),
                        main_args(p, cfg))
    if not uses_workspace(cfg):
        return [main]
    dw32 = Buffer("workspace", dw32_offset(p, cfg)) if cfg.dw32 else NULL
    red = KernelLaunch("reduce", f"wgrad_wgmma_reduce_{p.dtype}",
                       LaunchConfig(grid=(reduce_grid(p), 1, 1), block=(REDUCE_THREADS, 1, 1)),
                       (Buffer("workspace"), Buffer("dw"), dw32, np.int64(dw_elements(p)), np.int32(cfg.splits)))
    return [main, red]


# ---- CPU models of the launches ----------------------------------------------------------------


def _unit_stores(p: Conv2dProblem, cfg: WgradWgmmaConfig, u: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(split, flat [K][R S][C] indices, their (row, col) in the unit's bm x bn tile) that unit
    ``u``'s consumers store: rows k < K, columns c < C of its tile (``store_unit``)."""
    t = cfg.tile
    tm, tn, tap, split, _, _ = unit_of(p, t, cfg.splits, u)
    rows, cols = np.arange(t.bm), np.arange(t.bn)
    k, c = tm * t.bm + rows, tn * t.bn + cols
    rows, cols, k, c = rows[k < p.K], cols[c < p.C], k[k < p.K], c[c < p.C]
    flat = (k[:, None] * (p.R * p.S) + tap) * p.C + c[None, :]
    return split, flat.ravel(), np.stack(np.broadcast_arrays(rows[:, None], cols[None, :])).reshape(2, -1)


def main_writes(p: Conv2dProblem, cfg: WgradWgmmaConfig, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per element by ``main`` on ``launch`` (default: the plan's grid): of dw [K][R][S][C]
    (flat) when it writes dw itself, else of the partials [splits][K][R][S][C] (flat). Block b
    stores units b, b + grid, ... (`block_units`) and each unit its rows < K, columns < C."""
    blocks = cfg.blocks if launch is None else launch.grid[0]
    t = cfg.tile
    units = tile_count(p, t) * cfg.splits
    counts = np.zeros((cfg.splits if uses_workspace(cfg) else 1) * dw_elements(p), dtype=np.int64)
    for us in block_units(units, blocks):
        for u in us:
            split, flat, _ = _unit_stores(p, cfg, u)
            np.add.at(counts, flat + (split * dw_elements(p) if uses_workspace(cfg) else 0), 1)
    return counts


def reduce_writes(p: Conv2dProblem, launch: LaunchConfig | None = None) -> np.ndarray:
    """Writes per dw element (flat) by the reduction's grid-stride loop on ``launch``: thread i of
    G = grid·block takes groups of 4 elements i, i + G, ... below K R S C / 4."""
    launch = launch or LaunchConfig(grid=(reduce_grid(p), 1, 1), block=(REDUCE_THREADS, 1, 1))
    quads = dw_elements(p) // 4
    return np.bincount(grid_stride_items(quads, launch.blocks * launch.threads_per_block), minlength=quads).repeat(4)


def wgrad_wgmma_covers(p: Conv2dProblem, launch: LaunchConfig, cfg: WgradWgmmaConfig) -> np.ndarray:
    """Writes per dw element (KRSC, flat) of the last launch: the reduction's (`reduce_writes`) or,
    with one split and no fp32 dw, ``main``'s (`main_writes`)."""
    if uses_workspace(cfg):
        return reduce_writes(p, launch)
    return main_writes(p, cfg, launch)


def step_tiles(p: Conv2dProblem, x: torch.Tensor, dy: torch.Tensor, tm: int, tn: int, tap: int, t: int,
               tile: WgradWgmmaTile) -> tuple[np.ndarray, np.ndarray]:
    """The stage the producer loads for GEMM-K step ``t`` of tile (tm, tn) of ``tap``, as two
    arrays of raw 16-bit values: a [64 pixels][bm filters] from dy's tiled map (zeros past K and
    N·P·Q), b [64 pixels][bn channels] from x's im2col map (`helpers.tma.im2col_rows`: zeros outside
    the image and past N; zeros past C). ``x`` NHWC and ``dy`` NPQK, fp16 or bf16."""
    npq, pq = p.N * p.P * p.Q, p.P * p.Q
    xb = x.contiguous().view(torch.int16).numpy().view(np.uint16)
    dyb = dy.contiguous().view(torch.int16).numpy().view(np.uint16).reshape(npq, p.K)
    a = np.zeros((BK, tile.bm), dtype=np.uint16)
    m = np.arange(t * BK, (t + 1) * BK)
    ks = tm * tile.bm + np.arange(tile.bm)
    ok_m, ok_k = m < npq, ks < p.K
    a[np.ix_(ok_m, ok_k)] = dyb[np.ix_(m[ok_m], ks[ok_k])]
    m0 = t * BK
    n0, rem = divmod(m0, pq)
    p0, q0 = divmod(rem, p.Q)
    r, s = divmod(tap, p.S)
    (sh, sw), (ph, pw), (dh, dw) = p.stride, p.padding, p.dilation
    rows = im2col_rows(x_map(p), (q0 * sw - pw, p0 * sh - ph, n0), (s * dw, r * dh))
    b = np.zeros((BK, tile.bn), dtype=np.uint16)
    cs = tn * tile.bn + np.arange(tile.bn)
    ok_c = cs < p.C
    for i, pix in enumerate(rows):
        if pix is not None:
            n, h, w = pix
            b[i, ok_c] = xb[n, h, w, cs[ok_c]]
    return a, b


def main_model(p: Conv2dProblem, x: torch.Tensor, dy: torch.Tensor, cfg: WgradWgmmaConfig,
               blocks: int | None = None) -> np.ndarray:
    """What ``main`` writes, in float64, by the kernel's own walk: every block's units in order
    (`block_units`), each step's stage placed in a shared-memory image through the 128-byte
    swizzle (`place_slot`, in its ring slot) and read back by every consumer through the
    descriptors its ``mma_step`` builds (`slot_product`); then each unit's rows < K, columns < C
    stored as ``store_unit`` stores them (rounded to the dtype when direct). Elements no unit
    writes stay NaN. Each slot's products are summed in float64 and added to the fp32 accumulator
    once per step: bit-exact to the kernel where every partial sum is an integer fp32 holds
    (integer inputs), within the fp32 bound otherwise.

    Returns:
        the partials [splits][K][R][S][C] (fp32 values, float64 array) when `uses_workspace`, else dw
        [K][R][S][C] rounded to ``p.dtype``.
    """
    t, n = cfg.tile, dw_elements(p)
    blocks = cfg.blocks if blocks is None else blocks
    out = np.full((cfg.splits if uses_workspace(cfg) else 1) * n, np.nan)
    smem = np.zeros(t.stages * t.slot_bytes // 2, dtype=np.uint16)  # the ring from offset 0 (1024-aligned)
    units = tile_count(p, t) * cfg.splits
    for us in block_units(units, blocks):
        ring = 0  # the ring's steps, across the block's units
        for u in us:
            tm, tn, tap, split, t0, t1 = unit_of(p, t, cfg.splits, u)
            acc = np.zeros((t.bm, t.bn), dtype=np.float32)
            for step in range(t0, t1):
                slot = (ring % t.stages) * t.slot_bytes
                place_slot(smem, t, slot, *step_tiles(p, x, dy, tm, tn, tap, step, t))
                for g in range(t.consumers):
                    rows = slice(g * t.mt * BOX, (g + 1) * t.mt * BOX)
                    acc[rows] += slot_product(smem, t, slot, g, p.dtype).astype(np.float32)
                ring += 1
            split, flat, (r, c) = _unit_stores(p, cfg, u)
            vals = acc[r, c].astype(np.float64)
            if not uses_workspace(cfg):
                vals = torch.from_numpy(vals).to(p.torch_dtype).double().numpy()
            out[flat + (split * n if uses_workspace(cfg) else 0)] = vals
    return out


def reduce_model(partials: np.ndarray, splits: int, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """The reduction's arithmetic: (dw rounded once to ``dtype``, the fp32 sum), each as a float64
    array, from the partials [splits][count] (flat), summed in fp32 in split order 0, 1, ..."""
    parts = partials.reshape(splits, -1).astype(np.float32)
    total = parts[0].copy()
    for z in range(1, splits):
        total = total + parts[z]  # fp32 adds, split order
    return torch.from_numpy(total).to(dtype).double().numpy(), total.astype(np.float64)


# ---- refusals and the variant ------------------------------------------------------------------


def wgrad_wgmma_reason(p: Conv2dProblem, cfg: WgradWgmmaConfig) -> str | None:
    """None if the kernels run ``p`` with ``cfg``, else why not: groups; C % 8 and K % 8 (the maps'
    16-byte strides: x's pixels, dy's pixel rows); the im2col copy's filter offsets and the two
    maps' limits (corners within -128 .. 127, strides at most 8: day 16's); 32-bit pixel, unit and
    step counts; a split with no step."""
    reason = groups_one_reason(p, instead="day 14's wgrad needs groups = 1 too; use cuDNN")
    if reason:
        return reason
    if p.C % 8 or p.K % 8:
        return (f"C = {p.C}, K = {p.K}: the copy engine reads x's pixels and dy's pixel rows in 16-byte strides "
                "(C % 8 == 0 and K % 8 == 0); pad the channels, or use cuDNN")
    (dh, dw) = p.dilation
    limit = OFFSET_LIMIT[4]
    for what, reach in (("(R-1)*dil_h", (p.R - 1) * dh), ("(S-1)*dil_w", (p.S - 1) * dw)):
        if reach >= limit:
            return f"filter reach {what} = {reach}: an im2col copy's filter offset is 8 bits (< {limit})"
    for name, desc in (("x", x_map(p)), ("dy", dy_map(p))):
        reason = desc.reason()
        if reason:
            return f"{name} tensor map: {reason}"
    npq = p.N * p.P * p.Q
    if npq + BK > INT32_MAX:
        return f"GEMM-K = N*P*Q = {npq} pixels (+ one step) does not fit the kernel's 32-bit pixel index"
    units = tile_count(p, cfg.tile) * cfg.splits
    if units + cfg.blocks > INT32_MAX or (units // cfg.blocks + 2) * steps_of(p) > INT32_MAX:
        return f"{units} work units (or a block's ring steps) do not fit the kernel's 32-bit counters"
    if not 1 <= cfg.splits <= steps_of(p):
        return f"splits = {cfg.splits}: 1 .. the {steps_of(p)} GEMM-K steps of 64 pixels (no empty split)"
    return None


def wgrad_wgmma_tensor_check(p: Conv2dProblem, tensors: dict) -> str | None:
    """x and dy 16-byte aligned (the copy engine's global addresses), dw 16-byte aligned (the
    reduction's 8-byte and the main kernel's 4-byte stores). None or the reason."""
    reason = alignment_reason(tensors, {"x": VEC_BYTES, "dy": VEC_BYTES}, "the copy engine's (TMA) global addresses")
    return reason or alignment_reason(tensors, {"dw": VEC_BYTES}, "the vector stores of dw")


def make_wgrad_wgmma(name: str = "wgrad_wgmma", tile: WgradWgmmaTile | str | None = None, splits: int | None = None,
                     dw32: bool = False, sms: int | None = None, blocks: int | None = None) -> Variant:
    """A day-19 variant (not registered) with any of ``tile`` (a tile or its name), ``splits``, the
    SM count ``sms`` (the persistent grid and the split rule; None: the GPU's) and a grid capped at
    ``blocks`` forced; ``dw32``: also the fp32 dw, in the workspace (`dw32_view`).

    Raises:
        ValueError: an unknown tile, splits, sms or blocks below 1.
    """
    if isinstance(tile, str) and tile not in BY_NAME:
        raise ValueError(f"{CU_FILE} has no tile {tile!r}; instantiated: {', '.join(BY_NAME)}")
    for what, v in (("splits", splits), ("sms", sms), ("blocks", blocks)):
        if v is not None and v < 1:
            raise ValueError(f"{what} = {v}: at least 1")

    def config_fn(p: Conv2dProblem) -> WgradWgmmaConfig:
        cfg = choose(p, tile, splits, sms, dw32)
        return replace(cfg, blocks=min(cfg.blocks, blocks)) if blocks is not None else cfg

    forced = ", ".join(f"{k}={v.name if isinstance(v, WgradWgmmaTile) else v}" for k, v in
                       (("tile", tile), ("splits", splits), ("sms", sms), ("blocks", blocks)) if v is not None)
    return Variant(
        name=name,
        day=19,
        cu_file=CU_FILE,
        summary="wgrad on Hopper: TMA (tiled dy, im2col x), wgmma on transposed (MN-major) operands, persistent "
        "warp-specialised blocks, deterministic split-K" + (f" ({forced})" if forced else "")
        + (", fp32 dw too" if dw32 else ""),
        config_fn=config_fn,
        supports_fn=wgrad_wgmma_reason,
        launches_fn=wgrad_wgmma_launches,
        covers_fn=wgrad_wgmma_covers,
        op="wgrad",
        dtypes=("fp16", "bf16"),
        layouts=("NHWC",),
        accum="fp32",
        workspace_fn=workspace_bytes,
        tensor_check_fn=lambda p, tensors, ep, cfg: wgrad_wgmma_tensor_check(p, tensors),
        min_cc=HOPPER_CC,
        min_cc_why="wgmma on transposed operands, setmaxnreg and the bulk tensor copy in im2col mode",
        arch_suffix="a",
        configs_fn=None if (tile, splits, blocks) != (None, None, None) else lambda: [
            *(make_wgrad_wgmma(f"{name}[{t.name}]", t, dw32=dw32) for t in ENTRIES),
            *(make_wgrad_wgmma(f"{name}[{t.name}]_k3_grid1", t, splits=3, blocks=1, dw32=dw32) for t in ENTRIES),
        ],
    )


WGRAD_WGMMA = register(make_wgrad_wgmma())


# A training step on Hopper's kernels where they run, day 13's and 14's elsewhere (and on the layers
# the Hopper ones refuse): `days.day14_backward.train.Kernels` in order of preference; which one ran
# for each layer, and why the ones before it did not, is in `days.day14_backward.train.paths`.
HOPPER_KERNELS = Kernels(fprop=("igemm_wgmma", "igemm_production"), dgrad=("dgrad_wgmma", "dgrad"),
                         wgrad=("wgrad_wgmma", "wgrad"))


# ---- day 15's search space: the tiles x a ladder of split factors --------------------------------


def parse_space_config(config: str) -> tuple[WgradWgmmaTile, int]:
    """``"128x256_c2_s4_k14"`` -> (that tile, 14).

    Raises:
        ValueError: not a configuration name, or a tile the ``.cu`` file does not instantiate.
    """
    m = re.fullmatch(r"(.+)_k(\d+)", config)
    if not m or m.group(1) not in BY_NAME or int(m.group(2)) < 1:
        raise ValueError(f"a wgrad_wgmma configuration looks like '128x256_c2_s4_k14' (a WGRAD_WGMMA_ENTRY tile "
                         f"and a split factor of at least 1); got {config!r}")
    return BY_NAME[m.group(1)], int(m.group(2))


@functools.cache
def space_variant(config: str) -> Variant:
    """The variant forcing a configuration name's tile and split factor (one object per name)."""
    tile, splits = parse_space_config(config)
    return make_wgrad_wgmma(f"wgrad_wgmma[{config}]", tile, splits)


def ladder(p: Conv2dProblem, tile: WgradWgmmaTile, sms: int = DEFAULT_SMS) -> list[int]:
    """The split factors tried for ``tile``: 1, 2, 4, ... up to the first whose units (tiles x
    splits) reach two per SM, each split keeping `MIN_SPLIT_STEPS` steps, and the rule's
    (`choose_splits`)."""
    top = max(1, steps_of(p) // MIN_SPLIT_STEPS)
    out, s = {1, choose_splits(p, tile, sms)}, 2
    while s <= top and tile_count(p, tile) * s // 2 < 2 * sms:
        out.add(s)
        s *= 2
    return sorted(out)


def gemm_tile(p: Conv2dProblem, tile: WgradWgmmaTile, splits: int) -> GemmTile:
    """The model's view: M = K, N = C·R·S, GEMM-K = N·P·Q in ``splits`` slices of ceil(steps /
    splits) steps; a consumer's 64·mt x bn as the warp tile; DRAM: x and dy once, dw, and with more
    than one split the fp32 partials written and read back (8 bytes per dw element per split)."""
    partials = 8 * splits * dw_elements(p) if splits > 1 else 0
    return GemmTile(m=p.K, n=p.C * p.R * p.S, k=p.N * p.P * p.Q, bm=tile.bm, bn=tile.bn, bk=BK, warp_m=64 * tile.mt,
                    warp_n=tile.bn, threads=tile.threads, stages=tile.stages, shared_bytes=tile.shared_bytes, regs=168,
                    steps=cdiv(steps_of(p), splits), splits=splits, dram_bytes=p.min_bytes, extra_bytes=partials)


def space_candidates(p: Conv2dProblem, machine: Machine) -> list[Candidate]:
    """Every tile at every split of its `ladder` (on the machine's SM count), a family per tile;
    a split run pays the reduction's launch too. The rule's (tile, splits) is the prior."""
    rule = choose(p, sms=machine.sms)
    out = []
    for tile in ENTRIES:
        for s in ladder(p, tile, machine.sms):
            us = gemm_tile_us(gemm_tile(p, tile, s), machine) + (machine.launch_us if s > 1 else 0.0)
            cfg = space_config(tile, s)
            out.append(Candidate(cfg, space_variant(cfg), us, (tile, s) == (rule.tile, rule.splits), family=tile.name))
    return out


def space_variations(config: str, p: Conv2dProblem) -> list[str]:
    """Split factors about 0.7x and 1.4x of the configuration's, where they are new and allowed
    (a launch argument: no new build)."""
    tile, s = parse_space_config(config)
    top = max(1, steps_of(p) // MIN_SPLIT_STEPS)
    tried = ladder(p, tile, device_sms())  # the candidates' ladder: the machine's SMs are the GPU's
    return [space_config(tile, f) for f in between_splits(s, top, tried)]


SPACE = register_space(Space("wgrad_wgmma", space_candidates, space_variations, lambda cfg, p: space_variant(cfg),
                             summary="WGRAD_WGMMA_ENTRY tiles x split factors (deterministic split-K)"))
