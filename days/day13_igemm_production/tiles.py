"""Day 13's tile descriptions, and where they come from: the ``PIPE_ENTRY`` lines of the ``.cu``.

A `TileDescription` names one configuration of ``kernels/conv2d/13_igemm_production.cu``: block
tile BM x BN x BK, WGM x WGN warps, pipeline stages, resident blocks per SM and the instruction
shape. `TileDescription.reason` refuses one the kernel cannot build or launch, with the reason.
`INSTANTIATED` ({tile name: iterators}) is read from the ``.cu`` file's ``PIPE_ENTRY`` lines, the
one list of what is compiled.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from helpers.compile import kernel_path

CU_FILE = "13_igemm_production.cu"  # the entry points (PIPE_ENTRIES, the PIPE_TUNE_* block)
MAINLOOP = "igemm_mainloop.cuh"  # the kernel itself, as templates (day 14's dgrad includes it too)
INSTRUCTION = (16, 8, 16)  # mma.sync m16n8k16: the only instruction shape of the kernel
MAX_SMEM_PER_BLOCK = 227 * 1024  # the largest opt-in of sm_80..sm_120 (H100/H200); `prepare` asks the device


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
        ``constexpr bool FRAG_DB`` of ``igemm_mainloop.cuh``."""
        if self.bk not in (32, 64) or self.threads % (self.bk // 8):
            return False  # not a shape the kernel builds
        reg_cap = 65536 // (self.threads * max(self.min_blocks, 1))
        rows_per_pass = self.threads // (self.bk // 8)
        chunk_rows = self.bm // rows_per_pass + self.bn // rows_per_pass
        return iterator == "optimized" and (
            (self.accumulators_per_thread <= 64 and reg_cap >= 160) or (reg_cap >= 255 and chunk_rows <= 16)
        )

    def reason(self, smem_limit: int = MAX_SMEM_PER_BLOCK, instantiated: bool = True) -> str | None:
        """None if the kernel can be built and launched with this description, else why not.

        The rules are the kernel's static_asserts and launch limits, then (with
        ``instantiated``) whether ``13_igemm_production.cu`` instantiates it (`TILES`); a tile
        built alone (`tune_defines`) needs only the rules."""
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
        if instantiated and self.name not in TILES:
            return f"{CU_FILE} has no entry point for {self.name}; instantiated: {', '.join(TILES)}"
        return None


def read_entries(cu_file: str = CU_FILE, macro: str = "PIPE_ENTRY") -> dict[str, tuple[str, ...]]:
    """{tile name: iterators} from the ``<macro>(BM, BN, BK, WGM, WGN, STAGES, MINB, ITER, name)``
    lines of ``cu_file`` (the one list of what is compiled; day 14's dgrad reads its ``DGRAD_ENTRY``
    lines with it)."""
    out: dict[str, list[str]] = {}
    pat = re.compile(rf"^{macro}\((\d+), (\d+), (\d+), (\d+), (\d+), (\d+), (\d+), \w+, (\w+)\)", re.M)
    for bm, bn, bk, wm, wn, st, mb, it in pat.findall(kernel_path(cu_file).read_text()):
        out.setdefault(f"{bm}x{bn}x{bk}_w{wm}x{wn}_s{st}_b{mb}", []).append(it)
    return {k: tuple(v) for k, v in out.items()}


INSTANTIATED = read_entries()
TILES = tuple(INSTANTIATED)


def tiles_for(iterator: str) -> tuple[TileDescription, ...]:
    """The tile descriptions instantiated with ``iterator``."""
    return tuple(TileDescription.parse(t) for t, its in INSTANTIATED.items() if iterator in its)


# The tile's -D defines of the PIPE_TUNE_* block, in PIPE_TUNE_ENTRY's argument order (then _BF16).
TUNE_KEYS = ("PIPE_TUNE_BM", "PIPE_TUNE_BN", "PIPE_TUNE_BK", "PIPE_TUNE_WGM", "PIPE_TUNE_WGN", "PIPE_TUNE_ST",
             "PIPE_TUNE_MINB")


def tune_defines(tile: TileDescription, dtype: str) -> dict:
    """The ``-D`` defines that build ``tile`` alone (optimized iterator, one dtype: fp16 or bf16),
    the ``PIPE_TUNE_*`` block of ``13_igemm_production.cu``; its entry is named as an instantiated one."""
    values = (tile.bm, tile.bn, tile.bk, tile.warps_m, tile.warps_n, tile.stages, tile.min_blocks)
    return {**dict(zip(TUNE_KEYS, values)), "PIPE_TUNE_BF16": int(dtype == "bf16")}


def tune_entry_line(cu_file: str, defines: dict) -> str | None:
    """The line that adds the entry of a tile built alone (`tune_defines`) to another build of
    ``13_igemm_production.cu`` made the same way: ``PIPE_TUNE_ENTRY(BM, ..., MINB, OPTIMIZED,
    optimized, <bf16?>, <dtype>)``, the file's own macro; None for any other build (another file,
    or the file's instantiated entries). Day 15's tuner appends these lines so that a search's
    tiles share nvcc runs (`helpers.compile.merge_jobs`)."""
    if cu_file != CU_FILE or set(defines) != {*TUNE_KEYS, "PIPE_TUNE_BF16"}:
        return None
    bf16 = bool(int(defines["PIPE_TUNE_BF16"]))
    values = ", ".join(str(int(defines[k])) for k in TUNE_KEYS)
    return f"PIPE_TUNE_ENTRY({values}, OPTIMIZED, optimized, {'true, bf16' if bf16 else 'false, fp16'})"
