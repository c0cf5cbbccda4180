"""The tuner's cost model (day 15): a `Machine`'s rates and limits, and the predicted time of one
implicit-GEMM tile configuration (`gemm_tile_us`): waves of resident blocks over the SMs
(occupancy from shared memory, registers and threads), the tensor-core time of the padded tile
work at a rate that grows with the warp tile, the DRAM and L2 traffic, and a per-block pipeline
fill.

Sources: NVIDIA's CUDA C++ Best Practices Guide ("Occupancy", "Calculating occupancy").
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Machine:
    """The rates and limits the cost model uses.

    ``mma_tflops``: dense fp16 ``mma.sync`` with fp32 accumulation, all SMs (H200: 620, measured
    by day 11's probe); ``dram_gbps`` and ``l2_gbps``: device memory and L2 bandwidth (H200: copy
    measured at 4 TB/s; L2 an estimate); the rest from the device (`helpers.gpu.DeviceInfo`).
    """

    sms: int
    smem_per_sm: int
    regs_per_sm: int = 65536
    threads_per_sm: int = 2048
    mma_tflops: float = 620.0
    dram_gbps: float = 4000.0
    l2_gbps: float = 10000.0
    l2_bytes: int = 50 * 2**20
    launch_us: float = 3.0  # a launch's fixed cost on the GPU (ramp-up, tail)

    @classmethod
    def of(cls, info) -> Machine:
        """The machine of a `helpers.gpu.DeviceInfo`: its SMs, shared memory and L2; the mma.sync
        rate scaled from the H200's measured 620 TFLOP/s by SMs x clock (same per-SM rate: right
        for sm_90, an estimate elsewhere)."""
        clock = info.clock_mhz or 1980.0
        rate = 620.0 * info.sms * clock / (132 * 1980.0)
        return cls(sms=info.sms, smem_per_sm=info.smem_per_sm, regs_per_sm=info.regs_per_sm or 65536,
                   mma_tflops=rate, l2_bytes=info.l2_bytes or 50 * 2**20)


H200 = Machine(sms=132, smem_per_sm=228 * 1024)  # for the model without a GPU (CPU tests, the notebook's figures)


@dataclass(frozen=True)
class GemmTile:
    """What the model needs of one candidate: the GEMM (``m``, ``n``, ``k``), its tile (``bm``,
    ``bn``, ``bk``, ``warp_m`` x ``warp_n`` per warp, ``threads``, ``stages``), the bytes of shared
    memory and the registers per thread it is expected to use, the GEMM-K steps per block
    (``steps``, default ceil(k / bk)), the blocks per output tile (``splits``, split-K) and the
    bytes that must cross DRAM."""

    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    warp_m: int
    warp_n: int
    threads: int
    stages: int
    shared_bytes: int
    regs: int
    steps: int | None = None
    splits: int = 1
    dram_bytes: int | None = None  # the tensors' own bytes (an implicit GEMM's A is x read R·S times); default A+B+C
    extra_bytes: int = 0  # traffic beyond them (e.g. split-K partials)


def occupancy(t: GemmTile, mc: Machine) -> int:
    """Resident blocks per SM: the least of what shared memory (plus 1 KB reserved per block),
    registers (allocated per warp in units of 256) and threads allow; at least 1."""
    by_smem = mc.smem_per_sm // (t.shared_bytes + 1024)
    regs_per_warp = math.ceil(t.regs * 32 / 256) * 256
    by_regs = mc.regs_per_sm // (regs_per_warp * (t.threads // 32))
    by_threads = mc.threads_per_sm // t.threads
    return max(1, min(by_smem, by_regs, by_threads, 32))


def gemm_tile_us(t: GemmTile, mc: Machine) -> float:
    """Predicted microseconds of one implicit-GEMM launch: three times, combined as their 4-norm
    (close to the largest, but the others still break ties), plus the launch cost.

    * **tensor cores**: each SM runs its share of blocks in rounds of `occupancy`. A GEMM-K step of
      the b resident blocks takes the longer of b · (a step's FLOPs) / (the SM's mma rate x the
      warp tile's efficiency x the latency cover) and the load latency spread over the steps in
      flight, `LOAD_LATENCY_US` / (b · (stages − 1)). The efficiency wm·wn / (wm·wn + 8·(wm + wn))
      charges the ldmatrix traffic per mma (small warp tiles reload more per FLOP); the cover
      min(1, resident warps / `COVER_WARPS`) is how much of the mma pipe a few warps keep busy. Each round
      also pays one latency to fill the pipeline and `EPILOGUE_US`;
    * **DRAM**: ``dram_bytes`` (the tensors once) plus ``extra_bytes``;
    * **L2**: the GEMM's A read once per column of tiles and B once per row of tiles (cp.async.cg
      bypasses L1, so every tap's read of x reaches L2).
    """
    steps = t.steps if t.steps is not None else math.ceil(t.k / t.bk)
    m_tiles, n_tiles = math.ceil(t.m / t.bm), math.ceil(t.n / t.bn)
    blocks = m_tiles * n_tiles * t.splits
    occ = occupancy(t, mc)
    per_sm = math.ceil(blocks / mc.sms)
    rounds = math.ceil(per_sm / occ)
    resident = min(occ, per_sm)
    sm_flops_per_us = mc.mma_tflops * 1e6 / mc.sms
    wm, wn = t.warp_m, t.warp_n
    shape_eff = wm * wn / (wm * wn + WARP_TILE_COST * (wm + wn))
    cover = min(1.0, resident * (t.threads // 32) / COVER_WARPS)
    step_us = max(resident * 2 * t.bm * t.bn * t.bk / (sm_flops_per_us * shape_eff * cover),
                  LOAD_LATENCY_US / (resident * max(t.stages - 1, 1)))
    tensor_us = rounds * (steps * step_us + LOAD_LATENCY_US + EPILOGUE_US)
    a_bytes, b_bytes, c_bytes = 2 * t.m * t.k, 2 * t.n * t.k, 2 * t.m * t.n
    dram = t.dram_bytes if t.dram_bytes is not None else a_bytes + b_bytes + c_bytes
    dram_us = (dram + t.extra_bytes) / (mc.dram_gbps * 1e3)
    l2_us = (a_bytes * n_tiles + b_bytes * m_tiles) / (mc.l2_gbps * 1e3)
    return (tensor_us**4 + dram_us**4 + l2_us**4) ** 0.25 + mc.launch_us


LOAD_LATENCY_US = 0.8  # a global load's latency under load (L2 or DRAM), µs
WARP_TILE_COST = 8  # the ldmatrix cost per warp-tile edge, in units of mma work (see gemm_tile_us)
COVER_WARPS = 4  # resident warps per SM that keep the mma pipe busy; fitted on ResNet-50's sweep (pruning replayed:
#                 0.985 of the exhaustive best with 8, 0.991 with 4), out of sample 0.984 and 0.985 (day 15, section 4)
EPILOGUE_US = 0.5  # a block's epilogue: the output tile through shared memory to global
